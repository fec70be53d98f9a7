"""A trained model's replies as a dataset's targets (sequence-level distillation).

``empatheia data distill`` answers every listener turn of an EmpatheticDialogues file with
a model, its chain's emotion held to the data's label, and writes one ``ed-responses``
line per turn whose ``response`` is the model's reply (the human one kept as
``reference``). Training on that file teaches a new chain (the four steps the readers
build, :mod:`empatheia.chain_targets`) while keeping the teacher's replies; and because the
goal step is read from the reply, a goal that the teacher's reply follows is one the
dialogue decides, which a human listener's choice is not (docs/small_preset.md).

The output is written a line at a time, so a stopped run resumes where it stopped.
``empatheia data drop-echoes`` then leaves out the lines whose reply says again what the
listener already said (:func:`drop_listener_echoes`): a student copies such replies more
often than its teacher wrote them (docs/small_preset.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Union

import torch
from tqdm.auto import tqdm

from ..dialogue import Dialogue
from ..errors import DataError
from ..evaluation.text import LISTENER_ECHO_WORDS, echoes_listener
from ..io import atomic_path
from ..labels import normalize_label
from ..prompts import CHAIN_STEPS, PromptMode, parse_chain
from .readers import read_dataset

PathLike = Union[str, Path]
ED_FORMATS = ("ed-conversations", "ed-responses")


@dataclass
class DistillReport:
    """What :func:`distill_replies` wrote."""

    path: Path
    examples: int
    """How many of the dialogues given the file holds now."""
    written: int
    """Lines this call added (the rest were there from a run before)."""
    kept_reference: List[str] = field(default_factory=list)
    """Ids whose line keeps the human reply, because the model wrote no response line
    or an empty one."""
    not_held: List[str] = field(default_factory=list)
    """Ids whose chain the model wrote without the given emotion: the emotion step's
    lead-in never came as the choice expects it (the step misspelt, or the event ran to
    the token limit), so the reply follows the model's own reading."""


def _record(dialogue: Dialogue, reply: str, chain) -> dict:
    conv_id, _, _ = (dialogue.id or "").rpartition("/")
    model_reply = reply.strip()
    return {
        "conv_id": conv_id or dialogue.id,
        "context": [turn.text for turn in dialogue.turns],
        "response": model_reply or dialogue.response,
        "emotion": dialogue.emotion,
        "situation": dialogue.context,
        "reference": dialogue.response,
        "source": "model" if model_reply else "reference",
        "emotion_held": normalize_label(chain.speaker_emotion or "") == normalize_label(dialogue.emotion),
        # The teacher's own chain, for reading the file: training builds its chain targets
        # from the data (the label given here among them), not from these.
        "model_chain": {name: getattr(chain, name) for name, _ in CHAIN_STEPS if getattr(chain, name)},
    }


def _done_ids(path: Path) -> List[str]:
    """The ids already written to ``path``; an unfinished last line (a run killed while
    writing it) is cut off so that appending goes on from a whole line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    ids = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
            ids.append(f"{record['conv_id']}/{len(record['context'])}")
        except (ValueError, KeyError, TypeError):
            raise DataError("is not a line this command wrote; give another --out or remove the file",
                            file=path, record=f"line {number}") from None
    return ids


def distill_examples(source: PathLike, limit: Optional[int] = None) -> List[Dialogue]:
    """The first ``limit`` examples (all by default) of the EmpatheticDialogues file
    ``source``, each checked to carry the emotion label the chain is held to."""
    source = Path(source)
    corpus = read_dataset(source)
    if corpus.format not in ED_FORMATS:
        raise DataError(f"is {corpus.format}; distilling writes EmpatheticDialogues lines and reads "
                        f"{' or '.join(ED_FORMATS)}", file=source)
    dialogues = list(corpus)[:limit] if limit is not None else list(corpus)
    missing = [d.id for d in dialogues if not d.emotion]
    if missing:
        raise DataError("has no emotion label to hold the chain to", file=source, record=missing[0])
    # A response line's context says nothing of roles: it alternates from the speaker.
    uneven = [d.id for d in dialogues
              if [t.role for t in d.turns] != ["speaker" if i % 2 == 0 else "listener" for i in range(len(d.turns))]]
    if uneven:
        raise DataError("its turns do not alternate speaker, listener from the speaker, which a response line "
                        "cannot keep", file=source, record=uneven[0], field="roles")
    return dialogues


def distill_replies(
    model,
    dialogues: Sequence[Dialogue],
    out: PathLike,
    batch_size: int = 16,
    max_new_tokens: Optional[int] = None,
    progress: bool = True,
) -> DistillReport:
    """Answer ``dialogues`` (:func:`distill_examples`) with ``model`` (an
    :class:`~empatheia.Empatheia` whose chain chooses its emotion among labels), the
    chain's emotion given as each dialogue's label, with the model's own decoding
    settings (``max_new_tokens`` its config's by default); append one ``ed-responses`` line
    per dialogue to ``out`` (see the module's doc), skipping the dialogues it already holds."""
    out = Path(out)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    done = set(_done_ids(out))
    todo = [d for d in dialogues if d.id not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    kept: List[str] = []
    not_held: List[str] = []
    model.eval()
    model.merge_adapter()
    bar = tqdm(total=len(dialogues), initial=len(dialogues) - len(todo), unit="example", desc="distilling",
               disable=not progress)
    with open(out, "a", encoding="utf-8") as handle, torch.inference_mode():
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            written = model.generate_text(batch, PromptMode.FULL, max_new_tokens, reserve_signals=False,
                                          given_emotions=[d.emotion for d in batch])
            for dialogue, text in zip(batch, written.texts):
                chain, reply = parse_chain(text)
                # Text without a response line is no reply: the human one stays the target.
                record = _record(dialogue, reply if chain.parsed else "", chain)
                if record["source"] == "reference":
                    kept.append(dialogue.id)
                if not record["emotion_held"]:
                    not_held.append(dialogue.id)
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            bar.update(len(batch))
    bar.close()
    return DistillReport(path=out, examples=len(done & {d.id for d in dialogues}) + len(todo), written=len(todo),
                         kept_reference=kept, not_held=not_held)


@dataclass
class EchoFilterReport:
    """What :func:`drop_listener_echoes` wrote."""

    path: Path
    kept: int
    dropped: List[str]
    """Ids of the lines left out, in the file's order."""
    with_listener_turn: int
    """Lines whose context has a listener turn (the only ones that can echo)."""


def drop_listener_echoes(source: PathLike, out: PathLike, words: int = LISTENER_ECHO_WORDS) -> EchoFilterReport:
    """Copy the ``ed-responses`` file ``source`` to ``out`` without the lines whose
    ``response`` shares a run of ``words`` words with one of the listener's turns of its
    ``context`` (:func:`~empatheia.evaluation.text.echoes_listener`, the measure
    ``empatheia eval`` reports as ``listener_echo_share``). The kept lines are copied
    byte for byte, in order; ``out`` is written whole or not at all."""
    source, out = Path(source), Path(out)
    if out.resolve() == source.resolve():
        raise DataError("is also the input: write the filtered lines to another file", file=out)
    corpus = read_dataset(source)  # checks every line, naming the one that is bad
    if corpus.format != "ed-responses":
        raise DataError(f"is {corpus.format}; only ed-responses lines (a context and its response) are filtered",
                        file=source)
    lines = [line for line in source.read_text(encoding="utf-8").splitlines(keepends=True) if line.strip()]
    if len(lines) != len(corpus.dialogues):
        raise DataError(f"has {len(lines)} lines but {len(corpus.dialogues)} examples", file=source)
    kept, dropped, with_listener = [], [], 0
    for line, dialogue in zip(lines, corpus.dialogues):
        echo = echoes_listener([t.text for t in dialogue.turns], [t.role for t in dialogue.turns],
                               dialogue.response or "", words)
        with_listener += echo is not None
        if echo:
            dropped.append(dialogue.id)
        else:
            kept.append(line if line.endswith("\n") else line + "\n")
    with atomic_path(out) as partial:
        partial.write_text("".join(kept), encoding="utf-8")
    return EchoFilterReport(path=out, kept=len(kept), dropped=dropped, with_listener_turn=with_listener)


__all__: Sequence[str] = ("DistillReport", "EchoFilterReport", "distill_examples", "distill_replies",
                          "drop_listener_echoes")
