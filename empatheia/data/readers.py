"""Readers of the dialogue datasets Empatheia trains and evaluates on.

Each reader turns a file into :class:`~empatheia.Dialogue` examples: a dialogue history
and, for training data, the gold response, Chain of Empathy, emotion label and (with
media) the response's speech and video. Every label is checked against the model's
:class:`~empatheia.labels.LabelSets`. Bad input is a :class:`DataError` that names the
file, the record and the field, or, with ``on_error="skip"``, an entry of the returned
:class:`DialogueCorpus`'s ``skipped`` report.

Formats
-------
``avamerg``
    The released AvaMERG ``train.json``/``test.json``: a list of conversations, one
    example per turn (:func:`avamerg_dialogue`); media
    ``dia{conversation_id}utt{index}_{avatar ID}.wav/.mp4``.
``ed-conversations``
    EmpatheticDialogues-style JSONL, one conversation per line (``conv_id``,
    ``situation``, ``utterances``, ``roles``, ``emotion``): one example per listener
    utterance, with the emotion label and a chain built from the situation, the emotion
    and the speaker's turns (:mod:`empatheia.chain_targets`).
``ed-responses``
    EmpatheticDialogues-style JSONL, one example per line (``conv_id``, ``context``,
    ``response``, ``situation``, ``emotion``), roles alternating speaker first.
``avatar``
    This project's JSONL for a new avatar dataset, one example per line; see
    ``docs/data.md``.

:func:`read_example` reads the one example of a file that ``empatheia respond`` answers,
picked by conversation and turn. A ``labels`` argument is label sets or the path of a
labels YAML file (:func:`as_label_sets`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ..chain_targets import complete_chain
from ..dialogue import Dialogue, Turn
from ..errors import DataError, SkipReport
from ..io import NESTING_REASON, parse_json, parse_jsonl, read_text
from ..labels import LabelSets, UnknownEmotionError
from ..prompts import ROLE_NAMES, ChainOfEmpathy

FORMATS = ("avamerg", "ed-conversations", "ed-responses", "avatar")
CHAIN_FIELDS = ("event_scenario", "speaker_emotion", "emotion_cause", "goal_to_response")
MAX_UTTERANCE_CHARS = 8192
"""The longest utterance (or response) a reader accepts, in characters. The processor drops
the oldest turns of a history that does not fit ``language_model.max_length``, but never
cuts the last turn or the target; at about four characters a token, 8192 characters fill
the largest shipped max_length (``paper``'s 2048 tokens) alone, so a longer utterance can
fit no prompt and is an error at reading time, in ``data check`` as in ``respond``.
Shorter ones that still overflow a smaller model's max_length are the processor's error."""
PathLike = Union[str, Path]
LabelsLike = Union[LabelSets, str, "os.PathLike[str]"]
"""What a ``labels`` argument takes: :class:`~empatheia.labels.LabelSets`, or the path of
a labels YAML file (``emotions``, ``profile``, ``emotion_fold``)."""


def as_label_sets(labels: Optional[LabelsLike]) -> Optional[LabelSets]:
    """``labels`` as :class:`~empatheia.labels.LabelSets`: label sets as they are, a path
    read with :meth:`~empatheia.labels.LabelSets.from_yaml` (a bad file is a ``ValueError``
    naming it), ``None`` as ``None`` (the caller's default)."""
    if labels is None or isinstance(labels, LabelSets):
        return labels
    if isinstance(labels, (str, os.PathLike)):
        return LabelSets.from_yaml(labels)
    raise TypeError(f"labels: expected a LabelSets or the path of a labels YAML file, got {type(labels).__name__}")


@dataclass
class DialogueCorpus:
    """The examples read from one file, and the samples skipped on request."""

    path: Path
    format: str
    dialogues: List[Dialogue]
    skipped: SkipReport = field(default_factory=SkipReport)
    conversations: int = 0
    """Conversations in the file (an AvaMERG or ED conversation gives several examples)."""

    def __len__(self) -> int:
        return len(self.dialogues)

    def __getitem__(self, index: int) -> Dialogue:
        return self.dialogues[index]

    def __iter__(self) -> Iterator[Dialogue]:
        return iter(self.dialogues)


def read_dataset(
    path: PathLike,
    format: str = "auto",
    media_root: Optional[PathLike] = None,
    labels: Optional[LabelsLike] = None,
    require_media: bool = True,
    on_error: str = "raise",
) -> DialogueCorpus:
    """Read a dataset file into training/evaluation examples.

    Args:
        path: the file.
        format: one of :data:`FORMATS`, or ``"auto"`` to tell from the content.
        media_root: folder of the media files (AvaMERG names; for ``avatar`` files the
            paths in the file are relative to it, default: the file's folder). ``None``
            for AvaMERG reads text only.
        labels: the label sets the emotion and profile labels are checked against: a
            :class:`~empatheia.labels.LabelSets` or the path of a labels YAML file
            (default: AvaMERG's).
        require_media: a missing media file is an error (or a skipped sample); with
            ``False`` the example keeps going without it and lists it in
            ``missing_media``.
        on_error: ``"raise"`` on the first bad record, or ``"skip"`` it and report it
            in the result's ``skipped``.
    """
    path = Path(path)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    labels = as_label_sets(labels) or LabelSets()
    records, escaped = _load_records(path)
    format, media_root = _format_and_media_root(path, records, format, media_root)
    conversations = len(records)
    if format == "ed-responses":
        # One line per response: several lines share a conversation.
        conversations = len({r.get("conv_id", n) if isinstance(r, dict) else n for n, r in records})
    corpus = DialogueCorpus(path=path, format=format, dialogues=[], conversations=conversations)
    context = _ReadContext(path, Path(media_root) if media_root is not None else None, require_media)
    for record_name, record in records:
        try:
            if isinstance(record, DataError):
                raise record
            bad_text = _text_error(record, record_name, path) if escaped else None
            if bad_text is not None:
                raise bad_text
            examples = _READERS[format](record, record_name, context)
        except DataError as error:
            examples = [error]
        for example in examples:
            try:
                if isinstance(example, DataError):
                    raise example
                dialogue, emotion_field = example
                profile_field = "{role}" if format == "avatar" else "{role}_profile"
                _check_labels(dialogue, emotion_field, profile_field, labels)
            except DataError as error:
                error = DataError(error.reason, file=error.file or path, record=error.record or record_name, field=error.field)
                if on_error == "raise":
                    raise error from None
                corpus.skipped.add(error)
                continue
            corpus.dialogues.append(dialogue)
    return corpus


@dataclass
class PickedExample:
    """One example of a dataset file, as :func:`read_example` picked it."""

    dialogue: Dialogue
    format: str
    conversation: str
    """The conversation it belongs to (see :func:`read_example`)."""
    position: int
    """Its index among the conversation's examples (``turn``, made non-negative)."""
    emotion_field: str
    """Where the file holds its emotion label."""

    def turn_field(self, index: int, attribute: str) -> str:
        """Where the dialogue's turn ``index``'s ``attribute`` (``text``, ``audio`` or
        ``video``) is in the file: AvaMERG's ``turns[1].dialogue_history[0].utterance``,
        avatar JSONL's ``history[0].audio``, EmpatheticDialogues' ``utterances[0]``."""
        if self.format == "avamerg":
            name = "utterance" if attribute == "text" else attribute
            return f"turns[{self.position}].dialogue_history[{index}].{name}"
        if self.format == "avatar":
            return f"history[{index}].{attribute}"
        return f"{'context' if self.format == 'ed-responses' else 'utterances'}[{index}]"


_UNITS = {"avamerg": "turns", "ed-conversations": "listener utterances", "ed-responses": "lines", "avatar": "lines"}
"""What a conversation's examples are, per format."""


def read_example(
    path: PathLike,
    conversation: Optional[str] = None,
    turn: int = -1,
    format: str = "auto",
    media_root: Optional[PathLike] = None,
    labels: Optional[LabelsLike] = None,
) -> PickedExample:
    """Read the one example of a dataset file that ``empatheia respond`` answers.

    A file holds conversations, each with one or more examples, in every format
    :func:`read_dataset` reads: an AvaMERG conversation (``conversation_id``) has one per
    turn; an EmpatheticDialogues conversation (``conv_id``) one per listener utterance
    (``ed-conversations``) or per line (``ed-responses``); in avatar JSONL the lines whose
    ``id`` is ``"<conversation>/<n>"`` (or just ``"<conversation>"``) make a conversation,
    and a line's whole ``id`` picks that line alone. ``conversation`` picks one (it may be
    left out when the file holds one), ``turn`` one of its examples (``-1``: the last).
    A wrong or missing choice is a :class:`DataError` naming the file and its
    conversations.

    Only the chosen conversation is read further: a bad record elsewhere does not matter.
    Its media must exist (``media_root`` as for :func:`read_dataset`); the gold
    response's media are not looked for. ``labels`` (label sets or a labels YAML path)
    check the example's labels as :func:`read_dataset` does; without them they are not
    checked, since answering does not read them.
    """
    path = Path(path)
    labels = as_label_sets(labels)
    records, escaped = _load_records(path)
    parsed = [(name, record) for name, record in records if not isinstance(record, DataError)]
    if not parsed:
        raise _unparsable(path, records)
    format, media_root = _format_and_media_root(path, records, format, media_root)
    keyed = [(_conversation_key(format, record, name), name, record) for name, record in parsed]
    ids = list(dict.fromkeys(key for key, _, _ in keyed))
    if conversation is None:
        if len(ids) != 1:
            raise DataError(f"holds {len(ids)} conversations ({_listed(ids)}); choose one with --conversation ID", file=path)
        conversation = ids[0]
    conversation = str(conversation)
    # An avatar line's whole id picks that line; otherwise the conversation's examples.
    chosen = [(name, record) for _, name, record in keyed
              if format == "avatar" and isinstance(record, dict) and record.get("id") == conversation]
    if not chosen:
        chosen = [(name, record) for key, name, record in keyed if key == conversation]
    if not chosen:
        unread = [record for _, record in records if isinstance(record, DataError)]
        note = f"; {len(unread)} line(s) could not be read ({unread[0].record}: {unread[0].reason})" if unread else ""
        raise DataError(f"no conversation {conversation!r}: give --conversation one of {_listed(ids)}{note}", file=path)
    context = _ReadContext(path, Path(media_root) if media_root is not None else None, require_media=True,
                           response_media=False)
    examples: List[Union[Tuple[Dialogue, str], DataError]] = []
    for name, record in chosen:
        bad_text = _text_error(record, name, path) if escaped else None
        if bad_text is not None:
            raise bad_text
        try:
            examples.extend(_READERS[format](record, name, context))
        except DataError as error:
            raise _in_file(error, path, name) from None
    if not examples:
        raise DataError(f"conversation {conversation!r} has no example to answer (its examples are its {_UNITS[format]}): "
                        "choose another with --conversation", file=path)
    if not -len(examples) <= turn < len(examples):
        raise DataError(f"turn {turn} is out of range: conversation {conversation!r} has {len(examples)} examples "
                        f"(its {_UNITS[format]}); give --turn 0 to {len(examples) - 1}, or -1 for the last", file=path)
    example = examples[turn]
    if isinstance(example, DataError):
        raise _in_file(example, path, conversation)
    dialogue, emotion_field = example
    if labels is not None:
        try:
            _check_labels(dialogue, emotion_field, "{role}" if format == "avatar" else "{role}_profile", labels)
        except DataError as error:
            raise _in_file(error, path, dialogue.id) from None
    return PickedExample(dialogue, format, conversation, turn % len(examples), emotion_field)


def _conversation_key(format: str, record: Any, name: str) -> str:
    """The conversation a record belongs to (its record name when it names none)."""
    if not isinstance(record, dict):
        return name
    if format == "avatar":
        example_id = record.get("id")
        return example_id.rsplit("/", 1)[0] if isinstance(example_id, str) and example_id else name
    value = record.get("conversation_id" if format == "avamerg" else "conv_id")
    return str(value) if value is not None else name


def _listed(ids: Sequence[str], limit: int = 10) -> str:
    more = f", ... ({len(ids)} in all)" if len(ids) > limit else ""
    return ", ".join(repr(i) for i in ids[:limit]) + more


def _in_file(error: DataError, path: Path, record: str) -> DataError:
    """``error`` naming ``path`` (and ``record``) where it named no file (or record)."""
    return DataError(error.reason, file=error.file or path, record=error.record or record, field=error.field)


def _unparsable(path: Path, records: List[Tuple[str, Any]]) -> DataError:
    """The error of a file none of whose records parses: a JSON document's own error
    when the file is one (an object spread over lines fails on each of them)."""
    reason = records[0][1].reason
    text = read_text(path)
    if text.lstrip().startswith("{"):
        try:
            parse_json(text, path)
        except DataError as error:
            reason = error.reason
    if reason == NESTING_REASON:
        return DataError(reason, file=path)
    return DataError(f"not valid JSON ({reason})", file=path)


# ---------------------------------------------------------------------- file level
def _format_and_media_root(path: Path, records, format: str, media_root: Optional[PathLike]):
    """``(format, media_root)`` of a file: ``"auto"`` told from its records, and an avatar
    file's media found beside it unless ``media_root`` says otherwise."""
    if format == "auto":
        format = _detect_format(path, records)
    if format not in _READERS:
        raise ValueError(f"unknown dataset format {format!r}; choose one of {list(FORMATS)} or 'auto'")
    if format == "avatar" and media_root is None:
        media_root = path.parent
    return format, media_root


def _load_records(path: Path) -> Tuple[List[Tuple[str, Any]], bool]:
    """``(record name, record)`` pairs: the items of a JSON list, the lines of JSONL, or a
    file's one object. A JSONL line that is not JSON comes as a :class:`DataError` record,
    so that it can be skipped alone; a JSON list that does not parse is an error for the
    whole file. The flag says whether the text has a ``\\u`` escape, the only way a lone
    surrogate gets into parsed JSON (:func:`find_bad_text` need not look otherwise)."""
    text = read_text(path)
    whole = _single_object(text)
    if whole is not None:
        # One conversation object, as `empatheia respond` takes it.
        records = [(_conversation_name(whole, 0) if _is_avamerg(whole) else "line 1", whole)]
    elif text.lstrip().startswith("["):
        records = [(_conversation_name(item, i), item) for i, item in enumerate(parse_json(text, path))]
    else:
        records = [(f"line {number}", record) for number, record in parse_jsonl(text, path, keep_bad_lines=True)]
    if not records:
        raise DataError("no records (the file is empty)", file=path)
    return records, "\\u" in text


def _single_object(text: str) -> Optional[Dict[str, Any]]:
    """The file's one JSON object, or ``None`` when it is a list or JSONL (several objects)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None  # JSONL (the second line is "extra data"), whose bad lines are reported per line
    return value if isinstance(value, dict) else None


def _is_avamerg(record: Any) -> bool:
    return isinstance(record, dict) and "turns" in record and "conversation_id" in record


def find_bad_text(value: Any) -> Optional[Tuple[str, str]]:
    """``(field, reason)`` of the first string (or key) in a parsed JSON value that is not
    valid Unicode text: a lone surrogate (``"\\ud800"``), which JSON allows and UTF-8
    cannot encode, so it would fail only when a tokenizer or a file writer meets it.
    ``None`` when every string is fine."""
    stack = [("", value)]  # iterative: a deep value must not exhaust the recursion limit
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                return where, f"holds a lone surrogate {item[error.start]!r} at character {error.start}: not valid Unicode text"
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                at = f"{where}.{key}" if where else str(key)
                bad = find_bad_text(key) if isinstance(key, str) and not key.isascii() else None
                if bad is not None:
                    return at, f"key {bad[1]}"
                stack.append((at, child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def _text_error(record: Any, name: str, path: Path) -> Optional[DataError]:
    bad = find_bad_text(record)
    return DataError(bad[1], file=path, record=name, field=bad[0] or None) if bad else None


def _conversation_name(item: Any, position: int) -> str:
    if isinstance(item, dict) and isinstance(item.get("conversation_id"), str):
        return item["conversation_id"]
    return f"item {position}"


def _detect_format(path: Path, records: List[Tuple[str, Any]]) -> str:
    parsed = [(name, record) for name, record in records if not isinstance(record, DataError)]
    if not parsed:
        raise records[0][1]
    name, first = parsed[0]
    if isinstance(first, dict):
        if _is_avamerg(first):
            return "avamerg"
        if "utterances" in first:
            return "ed-conversations"
        if "history" in first:
            return "avatar"
        if "context" in first and "response" in first:
            return "ed-responses"
    raise DataError(
        f"cannot tell the dataset format from the first record (keys {sorted(first) if isinstance(first, dict) else type(first).__name__}); "
        f"pass format= one of {list(FORMATS)}",
        file=path,
        record=name,
    )


@dataclass
class _ReadContext:
    path: Path
    media_root: Optional[Path]
    require_media: bool
    response_media: bool = True
    """Also attach the gold response's media (training and evaluation; answering needs none)."""


# ---------------------------------------------------------------------- labels
def _check_labels(dialogue: Dialogue, emotion_field: str, profile_field: str, labels: LabelSets) -> None:
    """Every label of an example must be one the model knows (or folds); ``emotion_field``
    and ``profile_field`` (``{role}`` filled in) say where the file holds them, for the
    error message."""
    if dialogue.emotion is not None:
        try:
            labels.emotion_class(dialogue.emotion)
        except UnknownEmotionError as error:
            raise DataError(str(error), record=dialogue.id, field=emotion_field) from None
    for role, profile in (("speaker", dialogue.speaker_profile), ("listener", dialogue.listener_profile)):
        for attribute, value in (profile or {}).items():
            if attribute not in labels.profile:
                continue  # avatar IDs, names and other descriptive keys
            try:
                labels.profile_index(attribute, value)
            except ValueError as error:
                raise DataError(str(error), record=dialogue.id, field=f"{profile_field.format(role=role)}.{attribute}") from None


def _chain(coe: Any, name: str, field_name: str, strict: bool) -> Optional[ChainOfEmpathy]:
    """The Chain of Empathy object a record holds at ``field_name`` (``None`` when it has
    none): string or null steps of :data:`CHAIN_FIELDS`; ``strict`` rejects other keys."""
    if coe is None:
        return None
    if not isinstance(coe, dict):
        raise DataError(f"should be an object, got {type(coe).__name__}", record=name, field=field_name)
    unknown = sorted(set(coe) - set(CHAIN_FIELDS))
    if strict and unknown:
        raise DataError(f"unknown keys {unknown} (known: {list(CHAIN_FIELDS)})", record=name, field=field_name)
    for key in CHAIN_FIELDS:
        value = coe.get(key)
        if value is not None and not isinstance(value, str):
            raise DataError(f"should be a string, got {type(value).__name__}", record=name, field=f"{field_name}.{key}")
    return ChainOfEmpathy(**{key: coe.get(key) for key in CHAIN_FIELDS})


# ---------------------------------------------------------------------- AvaMERG
def avamerg_dialogue(
    conversation: Dict[str, Any],
    turn: int = -1,
    media_root: Optional[Union[str, Path]] = None,
    require_media: bool = True,
    response_media: bool = False,
) -> Dialogue:
    """Build the dialogue of one turn of a released AvaMERG conversation.

    ``turn`` indexes ``conversation["turns"]`` (``-1``: the last). With ``media_root``
    each utterance's ``dia{conversation_id}utt{index}_{avatar ID}.wav/.mp4`` is
    attached; with ``response_media`` (training) so is the gold response's (the
    utterance after the history, spoken by the listener). A missing file is a
    :class:`~empatheia.data.DataError` naming it, or with ``require_media=False`` is
    listed in ``missing_media``. Test-form conversations (no profiles) match any
    avatar ID. Train-form turns also give the gold ``response`` and ``chain``.
    Malformed input raises :class:`~empatheia.data.DataError` naming the record
    (``conversation/turn``) and the field.
    """
    cid = conversation.get("conversation_id", "?") if isinstance(conversation, dict) else "?"
    if not isinstance(cid, str):
        raise DataError(f"should be a string, got {type(cid).__name__}", record=str(cid), field="conversation_id")
    turns = _require(conversation, "turns", cid, "", list)
    if not turns:
        raise DataError("is empty", record=cid, field="turns")
    try:
        record = turns[turn]
    except IndexError:
        raise IndexError(f"conversation {cid}: turn {turn} out of range (it has {len(turns)} turns)") from None
    position = turn % len(turns)
    name = f"{cid}/{record.get('turn_id', position) if isinstance(record, dict) else position}"
    at = f"turns[{position}]"
    history = _require(record, "dialogue_history", name, at, list)
    if not history:
        raise DataError("is empty", record=name, field=f"{at}.dialogue_history")
    profiles = {}
    for role in ROLE_NAMES:
        profile = conversation.get(f"{role}_profile")
        if profile is not None and not isinstance(profile, dict):
            raise DataError(f"should be an object, got {type(profile).__name__}", record=cid, field=f"{role}_profile")
        profiles[role] = profile
    root = Path(media_root) if media_root is not None else None
    missing: List[str] = []
    out_turns = []
    last_index = -1
    for i, utterance in enumerate(history):
        where = f"{at}.dialogue_history[{i}]"
        role = _require(utterance, "role", name, where, str)
        if role not in ROLE_NAMES:
            raise DataError(f"unknown role {role!r} (expected one of {sorted(ROLE_NAMES)})", record=name, field=f"{where}.role")
        text = _utterance(_require(utterance, "utterance", name, where, str), name, f"{where}.utterance")
        index = _require(utterance, "index", name, where, (int, str))
        try:
            last_index = int(index)
        except ValueError:
            raise DataError(f"should be an integer, got {index!r}", record=name, field=f"{where}.index") from None
        audio = video = None
        if root is not None:
            avatar = (profiles[role] or {}).get("ID")
            found = _media_files(root, cid, index, avatar, require_media, missing, name, where)
            audio, video = found
        if not text.strip() and audio is None and video is None:
            raise DataError("is empty and the utterance has no media", record=name, field=f"{where}.utterance")
        out_turns.append(Turn(role=role, text=text, audio=audio, video=video, profile=profiles[role]))
    response = record.get("response")
    if response is not None:
        if not isinstance(response, str):
            raise DataError(f"should be a string, got {type(response).__name__}", record=name, field=f"{at}.response")
        _utterance(response, name, f"{at}.response")
    context = _optional_string(record, "context", name, f"{at}.context")
    chain = _chain(record.get("chain_of_empathy"), name, f"{at}.chain_of_empathy", strict=False)
    if chain is not None:
        # A record with all four steps keeps them as they are; missing ones are built as
        # ED's are (empatheia.chain_targets), so every target names the whole chain.
        chain = complete_chain(chain, context, [t.text for t in out_turns if t.role == "speaker"], reply=response)
    response_audio = response_video = None
    if root is not None and response_media:
        avatar = (profiles["listener"] or {}).get("ID")
        response_audio, response_video = _media_files(
            root, cid, last_index + 1, avatar, require_media, missing, name, f"{at}.response"
        )
    return Dialogue(
        turns=out_turns,
        id=name,
        context=context,
        speaker_profile=profiles["speaker"],
        listener_profile=profiles["listener"],
        response=response,
        chain=chain,
        response_audio=response_audio,
        response_video=response_video,
        missing_media=missing,
    )


def _utterance(text: str, name: str, field_name: str) -> str:
    if len(text) > MAX_UTTERANCE_CHARS:
        raise DataError(
            f"is {len(text)} characters long, over the {MAX_UTTERANCE_CHARS} an utterance may have "
            "(no model's prompt could hold it)",
            record=name,
            field=field_name,
        )
    return text


def _optional_string(record: dict, key: str, name: str, field_name: str) -> Optional[str]:
    value = record.get(key)
    if value is not None and not isinstance(value, str):
        raise DataError(f"should be a string, got {type(value).__name__}", record=name, field=field_name)
    return value


def _require(record: Any, key: str, name: str, where: str, kind):
    if not isinstance(record, dict):
        raise DataError(f"should be an object, got {type(record).__name__}", record=name, field=where)
    if key not in record:
        raise DataError("missing", record=name, field=f"{where}.{key}".lstrip("."))
    value = record[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DataError(f"should be {names}, got {type(value).__name__}", record=name, field=f"{where}.{key}".lstrip("."))
    return value


def _media_files(root: Path, cid: str, index, avatar, required: bool, missing: List[str], name: str, where: str):
    """The ``(audio, video)`` files of one utterance (``None`` where absent and allowed)."""
    found = []
    for suffix, kind in ((".wav", "audio"), (".mp4", "video")):
        stem = f"dia{cid}utt{index}_"
        if avatar is not None:
            path = root / f"{stem}{avatar}{suffix}"
            matches = [path] if path.is_file() else []
        else:
            path = root / f"{stem}*{suffix}"
            matches = sorted(root.glob(path.name))
            if len(matches) > 1:
                raise DataError(
                    f"several {kind} files match: {[p.name for p in matches]}", file=path, record=name, field=f"{where} ({kind})"
                )
        if matches:
            found.append(matches[0])
            continue
        if required:
            raise DataError(
                f"{kind} file not found (pass require_media=False to go on without it)",
                file=path,
                record=name,
                field=f"{where} ({kind})",
            )
        missing.append(str(path))
        found.append(None)
    return found


def _avamerg_examples(conversation: Any, name: str, ctx: _ReadContext) -> List[Union[Tuple[Dialogue, str], DataError]]:
    if not isinstance(conversation, dict):
        raise DataError(f"should be an object, got {type(conversation).__name__}", record=name)
    turns = conversation.get("turns")
    if not isinstance(turns, list) or not turns:
        raise DataError("missing or empty" if not turns else f"should be a list, got {type(turns).__name__}", record=name, field="turns")
    for role in ("speaker", "listener"):
        profile = conversation.get(f"{role}_profile")
        if profile is not None and not isinstance(profile, dict):
            # Shared by every turn: one report for the conversation, not one per turn.
            raise DataError(f"should be an object, got {type(profile).__name__}", record=name, field=f"{role}_profile")
    # Each turn is its own example: a bad turn is reported (or skipped) alone.
    examples: List[Union[Tuple[Dialogue, str], DataError]] = []
    for position in range(len(turns)):
        try:
            dialogue = avamerg_dialogue(
                conversation,
                turn=position,
                media_root=ctx.media_root,
                require_media=ctx.require_media,
                response_media=ctx.response_media and ctx.media_root is not None and isinstance(turns[position], dict)
                and "response" in turns[position],
            )
        except DataError as error:
            examples.append(error)
            continue
        examples.append((dialogue, f"turns[{position}].chain_of_empathy.speaker_emotion"))
    return examples


# ---------------------------------------------------------------------- EmpatheticDialogues
def _ed_turns(utterances: Sequence[Any], roles: Sequence[Any], name: str, field_name: str) -> List[Turn]:
    turns = []
    for i, (text, role) in enumerate(zip(utterances, roles)):
        if not isinstance(text, str) or not text.strip():
            raise DataError("should be a non-empty string", record=name, field=f"{field_name}[{i}]")
        _utterance(text, name, f"{field_name}[{i}]")
        if role not in ROLE_NAMES:
            raise DataError(f"unknown role {role!r} (expected one of {sorted(ROLE_NAMES)})", record=name, field=f"roles[{i}]")
        turns.append(Turn(role=role, text=text))
    return turns


def _ed_fields(record: Any, name: str, required: Sequence[Tuple[str, type]]) -> Dict[str, Any]:
    if not isinstance(record, dict):
        raise DataError(f"should be an object, got {type(record).__name__}", record=name)
    out = {}
    for key, kind in required:
        if key not in record:
            raise DataError("missing", record=name, field=key)
        if not isinstance(record[key], kind):
            raise DataError(f"should be {kind.__name__}, got {type(record[key]).__name__}", record=name, field=key)
        out[key] = record[key]
    return out


def _ed_situation(record: dict, name: str) -> Optional[str]:
    situation = record.get("situation")
    if situation is not None and not isinstance(situation, str):
        raise DataError(f"should be a string, got {type(situation).__name__}", record=name, field="situation")
    return situation


def _ed_chain(situation: Optional[str], emotion: str, turns: Sequence[Turn], reply: str) -> ChainOfEmpathy:
    # ED annotates the situation and the emotion only: the four steps are built from them,
    # the speaker's turns and the reply by the rules of empatheia.chain_targets (docs/data.md).
    return complete_chain(None, situation, [t.text for t in turns if t.role == "speaker"], emotion, reply)


def _ed_conversation_examples(record: Any, name: str, ctx: _ReadContext) -> List[Tuple[Dialogue, str]]:
    f = _ed_fields(record, name, [("conv_id", str), ("utterances", list), ("emotion", str)])
    utterances = f["utterances"]
    roles = record.get("roles")
    if roles is None:
        roles = ["speaker" if i % 2 == 0 else "listener" for i in range(len(utterances))]
    if not isinstance(roles, list) or len(roles) != len(utterances):
        raise DataError(f"should be a list as long as 'utterances' ({len(utterances)})", record=name, field="roles")
    if not utterances:
        raise DataError("is empty", record=name, field="utterances")
    turns = _ed_turns(utterances, roles, name, "utterances")
    situation = _ed_situation(record, name)
    examples = []
    for i in range(1, len(turns)):
        if turns[i].role != "listener":
            continue
        dialogue = Dialogue(
            turns=turns[:i],
            id=f"{f['conv_id']}/{i}",
            context=situation,
            response=turns[i].text,
            chain=_ed_chain(situation, f["emotion"], turns[:i], turns[i].text),
        )
        examples.append((dialogue, "emotion"))
    return examples


def _ed_response_examples(record: Any, name: str, ctx: _ReadContext) -> List[Tuple[Dialogue, str]]:
    f = _ed_fields(record, name, [("context", list), ("response", str), ("emotion", str)])
    if not f["context"]:
        raise DataError("is empty", record=name, field="context")
    roles = ["speaker" if i % 2 == 0 else "listener" for i in range(len(f["context"]))]
    turns = _ed_turns(f["context"], roles, name, "context")
    _utterance(f["response"], name, "response")
    conv = record.get("conv_id", name)
    situation = _ed_situation(record, name)
    chain = _ed_chain(situation, f["emotion"], turns, f["response"])
    dialogue = Dialogue(turns=turns, id=f"{conv}/{len(turns)}", context=situation, response=f["response"], chain=chain)
    return [(dialogue, "emotion")]


# ---------------------------------------------------------------------- avatar JSONL
def _avatar_examples(record: Any, name: str, ctx: _ReadContext) -> List[Tuple[Dialogue, str]]:
    if not isinstance(record, dict):
        raise DataError(f"should be an object, got {type(record).__name__}", record=name)
    example_id = record.get("id")
    if not isinstance(example_id, str) or not example_id:
        raise DataError("missing or not a non-empty string", record=name, field="id")
    name = example_id
    profiles = {}
    for role in ROLE_NAMES:
        profile = record.get(role)
        if profile is not None and not isinstance(profile, dict):
            raise DataError(f"should be an object, got {type(profile).__name__}", record=name, field=role)
        profiles[role] = profile
    history = record.get("history")
    if not isinstance(history, list) or not history:
        raise DataError("missing, empty or not a list", record=name, field="history")
    missing: List[str] = []
    turns = []
    for i, item in enumerate(history):
        at = f"history[{i}]"
        if not isinstance(item, dict):
            raise DataError(f"should be an object, got {type(item).__name__}", record=name, field=at)
        role = item.get("role")
        if role not in ROLE_NAMES:
            raise DataError(f"unknown role {role!r} (expected one of {sorted(ROLE_NAMES)})", record=name, field=f"{at}.role")
        text = item.get("text", "")
        if not isinstance(text, str):
            raise DataError(f"should be a string, got {type(text).__name__}", record=name, field=f"{at}.text")
        _utterance(text, name, f"{at}.text")
        audio = _avatar_media(item, "audio", name, at, ctx, missing)
        video = _avatar_media(item, "video", name, at, ctx, missing)
        if not text.strip() and audio is None and video is None:
            raise DataError("a turn needs text, audio or video", record=name, field=at)
        turns.append(Turn(role=role, text=text, audio=audio, video=video, profile=profiles[role]))
    response = record.get("response")
    response_text = response_audio = response_video = None
    if response is not None:
        if not isinstance(response, dict):
            raise DataError(f"should be an object, got {type(response).__name__}", record=name, field="response")
        response_text = response.get("text")
        if not isinstance(response_text, str) or not response_text.strip():
            raise DataError("missing or empty", record=name, field="response.text")
        _utterance(response_text, name, "response.text")
        if ctx.response_media:
            response_audio = _avatar_media(response, "audio", name, "response", ctx, missing)
            response_video = _avatar_media(response, "video", name, "response", ctx, missing)
    chain = _chain(record.get("chain"), name, "chain", strict=True)
    emotion = record.get("emotion")
    if emotion is not None and not isinstance(emotion, str):
        raise DataError(f"should be a string, got {type(emotion).__name__}", record=name, field="emotion")
    dialogue = Dialogue(
        turns=turns,
        id=example_id,
        context=_optional_string(record, "context", name, "context"),
        speaker_profile=profiles["speaker"],
        listener_profile=profiles["listener"],
        response=response_text,
        chain=chain,
        response_audio=response_audio,
        response_video=response_video,
        emotion=emotion,
        missing_media=missing,
    )
    return [(dialogue, "emotion" if emotion is not None else "chain.speaker_emotion")]


def _avatar_media(item: dict, kind: str, name: str, at: str, ctx: _ReadContext, missing: List[str]) -> Optional[Path]:
    value = item.get(kind)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise DataError(f"should be a file path, got {value!r}", record=name, field=f"{at}.{kind}")
    path = Path(value)
    if not path.is_absolute() and ctx.media_root is not None:
        path = ctx.media_root / path
    if path.is_file():
        return path
    if ctx.require_media:
        raise DataError(f"{kind} file not found", file=path, record=name, field=f"{at}.{kind}")
    missing.append(str(path))
    return None


_READERS: Dict[str, Callable[[Any, str, _ReadContext], list]] = {
    "avamerg": _avamerg_examples,
    "ed-conversations": _ed_conversation_examples,
    "ed-responses": _ed_response_examples,
    "avatar": _avatar_examples,
}
"""Each format's reader: a record (its name, the read context) -> its examples
``(dialogue, emotion field)``, or the :class:`DataError` of a bad one."""
