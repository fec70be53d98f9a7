"""What MERIA and early fusion share: a language core that reads virtual tokens made from
the user's utterance (its words, its speech, its face) before its prompt.

Both papers read one feature vector per modality of the user's utterance and turn them
into a few token embeddings prepended to the prompt (MERIA's soft prompts, early fusion's
projected joint embedding). Here those vectors come from the parts every system shares:

=========  ==========================================================  ================
modality   feature ``X_m`` of the speaker's last turn that has it       width
=========  ==========================================================  ================
text       the frozen base language model's last hidden states,         ``H`` (576 small)
           averaged over the turn's tokens (adapters off)
audio      the speech encoder's frames, averaged                       ``D_a`` (384)
video      the video encoder's frames, averaged                        ``D_v`` (1280)
=========  ==========================================================  ================

(MERIA reads RoBERTa, Emotion2Vec and LibreFace features; early fusion ImageBind's. The
paper preset's HuBERT and CLIP encoders and Vicuna core stand in for them; docs/variants.md
says what that changes.) Like the papers, one utterance per dialogue: audio and face vary
little within a dialogue, and the last speaker turn is the one the reply answers.

:class:`PrefixModel` holds an :class:`~empatheia.modeling.Empatheia` for its parts
(tokenizer, encoders, language model, generators) and adds its own trained modules; it
trains in the training loop as Empatheia does (``set_stage``, ``forward``,
``parameter_groups``, ``save_pretrained``) on :class:`UtteranceDataset` batches.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import yaml
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from ..dialogue import Dialogue
from ..data.dataset import class_labels
from ..dialogue import last_speaker_index
from ..errors import DataError, SkippedSample, skipped_or_raised
from ..io import atomic_path
from ..labels import LabelSets
from ..processing import IGNORE_INDEX, EncodedExample, MediaItem, Target, collate_media, merge_features
from ..prompts import PromptMode
from ..stages import Stage, get_stage
from .mcoe import mcoe_text

VARIANT_CONFIG_NAME = "variant.yaml"
VARIANT_WEIGHTS_NAME = "variant.safetensors"
MAX_UTTERANCE_TOKENS = 64
"""The text feature reads at most this many tokens of the turn (its end is kept)."""


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` ``(B, L, D)`` over the positions where ``mask`` ``(B, L)`` is
    True; zeros for a row with none."""
    weights = mask.to(values.dtype).unsqueeze(-1)
    return (values * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def rows_mean(features: torch.Tensor, rows: torch.Tensor, batch_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per batch row, the mean of the clips ``features`` ``(N, D)`` whose row ``rows``
    ``(N,)`` it is: ``(B, D)``, with ``(B,)`` True where a row has any clip."""
    sums = features.new_zeros(batch_size, features.shape[-1]).index_add_(0, rows, features)
    counts = torch.zeros(batch_size, device=features.device).index_add_(0, rows, torch.ones_like(rows, dtype=torch.float))
    return sums / counts.clamp(min=1.0).unsqueeze(-1).to(sums.dtype), counts > 0


def word_length(core) -> Optional[float]:
    """The typical length of ``core``'s token embeddings: the cap on a virtual token's."""
    from ..modeling import _embedding_norm

    return _embedding_norm(core.language_model)


class SoftPrompt(nn.Module):
    """MLP ``(B, D) -> (B, k, H)``: a feature vector as ``k`` virtual token embeddings
    (MERIA's soft-prompt projection networks; early fusion's linear projector is the
    one-layer case, ``hidden_dim=None``). ``max_norm`` caps each token's length at a
    typical word embedding's, so a fresh projector cannot drown the prompt."""

    def __init__(self, in_dim: int, width: int, num_tokens: int, hidden_dim: Optional[int] = None,
                 max_norm: Optional[float] = None):
        super().__init__()
        self.num_tokens, self.width = num_tokens, width
        out = num_tokens * width
        self.net = nn.Linear(in_dim, out) if hidden_dim is None else nn.Sequential(
            nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out))
        self.max_norm = max_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.net(x).view(x.shape[0], self.num_tokens, self.width)
        if self.max_norm is not None:
            norm = tokens.norm(dim=-1, keepdim=True)
            tokens = tokens * (self.max_norm / norm.clamp(min=self.max_norm))
        return tokens


# ---------------------------------------------------------------------- data
@dataclass
class UtteranceExample:
    """One dialogue for a variant's stage: its prompt (and target), the user's utterance and
    the labels the stage reads."""

    encoded: EncodedExample
    utterance_ids: torch.Tensor
    """``(L_u,)`` token ids of the last speaker turn's text (empty without one)."""
    utterance_text: str = ""
    audio: Optional[MediaItem] = None
    video: Optional[MediaItem] = None
    identity: Optional[str] = None
    """The speaker's identity (``speaker_profile['ID']``), for MERIA's triplet loss."""
    labels: Dict[str, int] = field(default_factory=dict)
    """Each speaker profile attribute -> class index (``-100``: unknown) and ``emotion``."""
    id: Optional[str] = None


class UtteranceCollator:
    """Batches :class:`UtteranceExample` items: the processor's text keys (``input_ids``,
    ``attention_mask``, ``labels``, ...), ``utterance_ids``/``utterance_mask`` ``(B, L_u)``
    and ``utterance_texts`` (the turns' text), ``audio``/``audio_lengths`` (or
    ``audio_cached``) with ``audio_rows`` ``(N_a,)`` (the batch row of each clip) and the
    same for video, ``identity`` ``(B,)`` (an index per distinct speaker identity in the
    batch, ``-1`` unknown), ``<name>_label`` ``(B,)`` and ``ids``. Skipped samples are
    listed under ``skipped``."""

    def __init__(self, processor, padding_side: str = "right"):
        self.processor = processor
        self.padding_side = padding_side

    def __call__(self, items: Sequence[Union[UtteranceExample, SkippedSample]]) -> Dict[str, Any]:
        skipped = [item for item in items if isinstance(item, SkippedSample)]
        examples = [item for item in items if not isinstance(item, SkippedSample)]
        if not examples:
            return {"skipped": skipped}
        batch: Dict[str, Any] = self.processor.collate([e.encoded for e in examples], padding_side=self.padding_side)
        pad = self.processor.ids.pad
        utterances = [e.utterance_ids if len(e.utterance_ids) else torch.tensor([pad]) for e in examples]
        batch["utterance_ids"] = pad_sequence(utterances, batch_first=True, padding_value=pad)
        lengths = torch.tensor([len(e.utterance_ids) for e in examples])
        batch["utterance_mask"] = torch.arange(batch["utterance_ids"].shape[1])[None, :] < lengths[:, None]
        batch["utterance_texts"] = [e.utterance_text for e in examples]
        for modality in ("audio", "video"):
            rows = [row for row, e in enumerate(examples) if getattr(e, modality) is not None]
            clips = [getattr(examples[row], modality) for row in rows]
            batch.update(collate_media(clips, modality, f"{modality}_lengths"))
            batch[f"{modality}_rows"] = torch.tensor(rows, dtype=torch.long)
        known = {key: index for index, key in enumerate(dict.fromkeys(e.identity for e in examples if e.identity))}
        batch["identity"] = torch.tensor([known.get(e.identity, -1) if e.identity else -1 for e in examples])
        for name in examples[0].labels:
            batch[f"{name}_label"] = torch.tensor([e.labels.get(name, IGNORE_INDEX) for e in examples])
        batch["ids"] = [e.id for e in examples]
        if skipped:
            batch["skipped"] = skipped
        return batch


class UtteranceDataset(Dataset):
    """A variant stage's examples: each dialogue in the stage's prompt layout with its
    target, the last speaker turn's text, speech and face, and the speaker's profile labels.

    Args:
        dialogues: the dialogues (their ids must be unique: the chains are found by them).
        processor: the core's :class:`~empatheia.processing.EmpatheiaProcessor`.
        stage: the variant's stage.
        labels: label sets; the speaker's profile attributes are classified by MERIA's
            identity branch.
        chains: MERIA's multimodal chains by dialogue id (the M-CoE stage's targets; the
            Response LLM's notes where ``notes`` is set).
        notes: the prompt carries the dialogue's chain after the dialogue (MERIA's Response
            LLM).
        on_error: ``raise`` at a bad example or ``skip`` it (listed in the batch's ``skipped``).
        media_cache: encoder outputs cached on disk (``data.media_cache``); a cached clip is
            not decoded again, which is most of a PDR or joint-embedding step's time.
    """

    def __init__(self, dialogues: Sequence[Dialogue], processor, stage: Union[str, Stage], labels: LabelSets,
                 chains: Optional[Dict[str, Any]] = None, notes: bool = False, on_error: str = "raise",
                 media_cache=None):
        self.dialogues = list(dialogues)
        self.processor = processor
        self.stage = get_stage(stage)
        self.labels = labels
        self.chains = chains
        self.notes = notes
        self.on_error = on_error
        self.media_cache = media_cache

    def collator(self) -> UtteranceCollator:
        return UtteranceCollator(self.processor)

    def __len__(self) -> int:
        return len(self.dialogues)

    def __getitem__(self, index: int) -> Union[UtteranceExample, SkippedSample]:
        dialogue = self.dialogues[index]
        try:
            return self.example(dialogue)
        except DataError as error:
            return skipped_or_raised(error, dialogue.id, self.on_error)

    def _chain(self, dialogue: Dialogue):
        if self.chains is None:
            return None
        chain = self.chains.get(dialogue.id)
        if chain is None:
            raise DataError("has no multimodal chain in data.mcoe (build them with `empatheia variants mcoe`)",
                            field="mcoe")
        return chain

    def example(self, dialogue: Dialogue) -> UtteranceExample:
        layout = self.stage.layout
        # A stage that trains the language model reads a target (the chain or the reply);
        # the PDR and the joint embedding read the utterance alone.
        needs_target = self.stage.reads_response
        chain = self._chain(dialogue) if (layout is PromptMode.MCOE and needs_target) or self.notes else None
        target = None
        if needs_target:
            if layout is PromptMode.MCOE:
                target = Target(text=mcoe_text(chain))
            else:
                if not dialogue.response:
                    raise DataError("has no gold response to train on", field="response")
                target = Target(response=dialogue.response, emotion=dialogue.emotion)
        notes = chain_notes(chain) if self.notes else None
        encoded = self.processor.encode(dialogue, layout, target, load_media=False, notes=notes)
        return utterance_example(dialogue, encoded, self.processor, self.labels, self.media_cache)


def chain_notes(chain) -> Optional[str]:
    """The multimodal chain as MERIA's Response LLM reads it after the dialogue."""
    return None if chain is None else "Multimodal chain of empathy:\n" + mcoe_text(chain)


def utterance_example(dialogue: Dialogue, encoded: EncodedExample, processor, labels: Optional[LabelSets],
                      media_cache=None) -> UtteranceExample:
    """``encoded`` with the dialogue's last speaker utterance (text, speech, face; cached
    encoder outputs where ``media_cache`` has them) and the speaker's labels."""
    tokenizer = processor.tokenizer
    text_at = last_speaker_index(dialogue, "text")
    text = dialogue.turns[text_at].text.strip() if text_at is not None else ""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][-MAX_UTTERANCE_TOKENS:] if text else []
    media = {}
    for modality in ("audio", "video"):
        at = last_speaker_index(dialogue, modality)
        media[modality] = processor.turn_media(dialogue, at, modality, media_cache) if at is not None else None
    profile = dialogue.speaker_profile or {}
    out = class_labels(labels, dialogue.emotion, profile, "speaker_profile") if labels is not None else {}
    identity = profile.get("ID") or profile.get("id")
    return UtteranceExample(encoded, torch.tensor(ids, dtype=torch.long), text, media["audio"], media["video"],
                            str(identity) if identity else None, out, dialogue.id)


# ---------------------------------------------------------------------- model
class PrefixModel(nn.Module):
    """A variant's trained parts over an :class:`~empatheia.modeling.Empatheia` ``core``.

    Subclasses set :attr:`system` and :attr:`options_class`, build their modules in
    ``__init__``, name their parameter groups (:meth:`group_of`) and compute each stage's
    loss (:meth:`forward`). Saved as the core's config and tokenizer plus
    ``variant.yaml`` (the system and its options) and ``variant.safetensors`` (every
    trained parameter, the language model's adapters included)."""

    system = "variant"
    options_class: Any = None
    groups: Tuple[str, ...] = ()
    """The parameter groups its stages train (every other parameter is ``frozen``)."""
    fresh_groups: Tuple[str, ...] = ()
    """Its groups that train from scratch (``optim.head_learning_rate``); LoRA only adapts."""
    late_options: Tuple[str, ...] = ()
    """Options a later stage may set differently from the model it starts from (those that
    change no parameter's shape and nothing an earlier stage trained)."""

    def __init__(self, core, options):
        super().__init__()
        self.core = core
        self.options = options
        self.stage: Optional[Stage] = None

    # ------------------------------------------------------------- what the loop reads
    @property
    def config(self):
        return self.core.config

    @property
    def processor(self):
        return self.core.processor

    @property
    def device(self) -> torch.device:
        return self.core.device

    # The media cache (data.media_cache) encodes with these.
    @property
    def speech_encoder(self):
        return self.core.speech_encoder

    @property
    def video_encoder(self):
        return self.core.video_encoder

    def label_sets(self) -> LabelSets:
        return self.core.label_sets()

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.core.gradient_checkpointing_enable(**kwargs)

    def group_of(self, name: str) -> str:
        """The group of parameter ``name`` (``frozen`` unless a subclass says otherwise)."""
        return "frozen"

    def parameter_groups(self) -> Dict[str, List[Tuple[str, nn.Parameter]]]:
        groups: Dict[str, List[Tuple[str, nn.Parameter]]] = {key: [] for key in self.groups + ("frozen",)}
        for name, param in self.named_parameters():
            groups[self.group_of(name)].append((name, param))
        return groups

    def stage_groups(self, stage: Stage) -> Tuple[str, ...]:
        """The groups ``stage`` trains (its ``trains``; an ablation may add to them)."""
        return stage.trains

    @classmethod
    def needs_init(cls, stage: Stage, options) -> Optional[str]:
        """Why ``stage`` cannot start from a fresh model with ``options`` (what it reads
        that an earlier stage trains), or ``None`` when it can."""
        return None

    def reads_chains(self, stage: Stage) -> Tuple[bool, bool]:
        """Whether ``stage``'s examples need MERIA's multimodal chains (``data.mcoe``), and
        whether their prompts carry them."""
        return False, False

    def set_stage(self, stage: Union[str, Stage]) -> "PrefixModel":
        stage = get_stage(stage)
        if stage.system != self.system:
            raise ValueError(f"stage {stage.name} trains {stage.system}, not {self.system}")
        trains = self.stage_groups(stage)
        for key, params in self.parameter_groups().items():
            for _, param in params:
                param.requires_grad_(key in trains)
        self.stage = stage
        return self

    # ------------------------------------------------------------- features
    @torch.no_grad()
    def utterance_features(self, batch: Dict[str, Any]) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """``X_m`` ``(B, D_m)`` of each modality and ``(B,)`` True where the row has it
        (module docstring); a modality no row has is left out."""
        core = self.core
        size = batch["input_ids"].shape[0]
        features, present = {}, {}
        mask = batch["utterance_mask"]
        if bool(mask.any()):
            decoder = core._hf_model().base_model
            with self.adapters_off(), torch.autocast("cpu", enabled=False):
                hidden = decoder(input_ids=batch["utterance_ids"], attention_mask=mask.long(), use_cache=False).last_hidden_state
            features["text"], present["text"] = masked_mean(hidden.float(), mask), mask.any(1)
        with torch.autocast("cpu", enabled=False):
            for modality, encoder in (("audio", core.speech_encoder), ("video", core.video_encoder)):
                rows = batch.get(f"{modality}_rows")
                if rows is None or rows.numel() == 0:
                    continue
                clips = batch.get(f"{modality}_features")  # complete, from the media cache
                if clips is None:
                    raw = encoder(batch[modality], batch[f"{modality}_lengths"]) if modality in batch else None
                    clips = merge_features(batch, modality, raw)
                clips = clips.float().mean(1)  # (N, D)
                features[modality], present[modality] = rows_mean(clips, rows.to(clips.device), size)
        return features, present

    @contextlib.contextmanager
    def adapters_off(self) -> Iterator[None]:
        """The base language model, without any LoRA (the text feature is the frozen
        model's, the same in every stage)."""
        self.core.unmerge_adapter()  # peft's unmerge, on disabling, would leave rounding
        with self.core.language_model.disable_adapter():
            yield

    @contextlib.contextmanager
    def adapter(self, name: str) -> Iterator[None]:
        """Run the language model with its adapter ``name``."""
        lm = self.core.language_model
        before = lm.active_adapter
        self.core.unmerge_adapter()  # a merged adapter would stay in the base weights
        if name == before:
            yield
            return
        # peft's set_adapter also marks the adapter's weights trainable: keep the stage's.
        flags = {n: p.requires_grad for n, p in lm.named_parameters()}
        lm.set_adapter(name)
        try:
            yield
        finally:
            lm.set_adapter(before)
            for n, p in lm.named_parameters():
                p.requires_grad_(flags[n])

    def prefixed_loss(self, prefix: Optional[torch.Tensor], batch: Dict[str, Any]) -> torch.Tensor:
        """L_emp of the batch's target with ``prefix`` ``(B, k, H)`` (or nothing) read before
        each right-padded prompt."""
        core = self.core
        embeddings = core.language_model.get_input_embeddings()(batch["input_ids"])
        mask, labels = batch["attention_mask"], batch["labels"]
        if prefix is not None:
            embeddings = torch.cat([prefix.to(embeddings.dtype), embeddings], dim=1)
            mask = torch.cat([mask.new_ones(prefix.shape[:2]), mask], dim=1)
            labels = torch.cat([labels.new_full(prefix.shape[:2], IGNORE_INDEX), labels], dim=1)
        hidden = core._hf_model().base_model(inputs_embeds=embeddings, attention_mask=mask, use_cache=False).last_hidden_state
        return core.language_modeling_loss(hidden, labels)

    def inference_batch(self, dialogues: Sequence[Dialogue], mode: PromptMode) -> Dict[str, Any]:
        """The utterance keys of a batch of dialogues to answer (no target)."""
        processor = self.processor
        examples = [utterance_example(d, processor.encode(d, mode, load_media=False), processor, None) for d in dialogues]
        batch = UtteranceCollator(processor, padding_side="left")(examples)
        device = self.device
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    # ------------------------------------------------------------- saving
    def trained_state_dict(self) -> Dict[str, torch.Tensor]:
        return {name: p for key, group in self.parameter_groups().items() if key != "frozen" for name, p in group}

    def load_trained_state_dict(self, state: Dict[str, torch.Tensor], source: str = "state dict") -> None:
        expected = self.trained_state_dict()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(f"{source} does not match this {self.system} model: missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]} ({len(missing)} and {len(unexpected)} in all)")
        with torch.no_grad():
            for name, param in expected.items():
                if tuple(state[name].shape) != tuple(param.shape):
                    raise ValueError(f"{source}: {name} has shape {tuple(state[name].shape)}, "
                                     f"this model {tuple(param.shape)}")
                param.copy_(state[name].to(param.dtype))

    @staticmethod
    def read_trained_state(path: Union[str, Path]) -> Dict[str, torch.Tensor]:
        path = Path(path)
        file = path / VARIANT_WEIGHTS_NAME if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"{path} is not a saved variant model: {VARIANT_WEIGHTS_NAME} is missing")
        return load_file(str(file))

    def save_pretrained(self, directory: Union[str, Path]) -> Path:
        """Write ``config.yaml`` and ``tokenizer/`` (the core's), ``variant.yaml`` and
        ``variant.safetensors``."""
        from ..modeling import CONFIG_NAME, TOKENIZER_DIR

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save_yaml(directory / CONFIG_NAME)
        self.core.tokenizer.save_pretrained(str(directory / TOKENIZER_DIR))
        with atomic_path(directory / VARIANT_CONFIG_NAME) as temporary:
            temporary.write_text(yaml.safe_dump({"system": self.system, "options": asdict(self.options)}, sort_keys=False))
        state = {k: v.detach().contiguous().cpu() for k, v in self.trained_state_dict().items()}
        with atomic_path(directory / VARIANT_WEIGHTS_NAME) as temporary:
            save_file(state, str(temporary), metadata={"format": "empatheia-variant", "system": self.system})
        return directory


def read_variant_config(directory: Union[str, Path]) -> Tuple[str, Dict[str, Any]]:
    """``(system, options)`` of a folder written by :meth:`PrefixModel.save_pretrained`."""
    path = Path(directory) / VARIANT_CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a saved variant model: {VARIANT_CONFIG_NAME} is missing")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or "system" not in data:
        raise ValueError(f"{path}: expected a mapping with `system` and `options`")
    return str(data["system"]), dict(data.get("options") or {})


def make_options(cls, values: Optional[Dict[str, Any]], source: str):
    """``cls`` (a dataclass of a variant's options) from ``values``; an unknown key is an
    error naming ``source`` and the known keys."""
    values = dict(values or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{source}: unknown {cls.__name__} keys {unknown}; known: {sorted(known)}")
    return cls(**values)
