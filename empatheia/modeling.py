"""The Empatheia model: encoders, projectors, LoRA language core, Content Synchronizer and
Style Disentangler in one ``nn.Module`` (§4), with the four training stages' losses (§5)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn.functional as F
from peft import set_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList

from .chain_targets import (GOAL_LEADS, act_key, emotion_row, fitting_acts, goal_acts, goal_lead, goal_repertoire,
                            load_act_openings, load_goal_acts, load_goal_counts)
from .config import EmpatheiaConfig
from .config_loader import ConfigError, read_yaml_mapping
from .decoding import Decoding
from .dialogue import Dialogue, Turn, last_speaker_index, speaker_words
from .encoders import SpeechEncoder, VideoEncoder
from .evaluation.text import listener_echo_start
from .heads import ContentOutput, ContentSynchronizer, StyleDisentangler, StyleOutput
from .labels import LabelSets, UnknownEmotionError, normalize_label
from .language_model import (
    ADAPTER_CONFIG_NAME,
    AUDIO_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    adapter_state_dict,
    build_language_model,
    build_tokenizer,
    check_adapter_config,
    load_adapter_weights,
    merge_adapter,
    save_adapter,
    special_token_ids,
)
from .logits_processors import (ChainEmotionChoice, ChainGoalChoice, ChainStepNgramBlock, ChainTemplate, GenericReplyPenalty,
                                ListenerEchoBlock, ReplyGoalOpenings, ReplyMinLength, ReplyRepetitionControl, ReplyRestart,
                                SeededSampling, SentenceRepetitionBlock, chain_lead_ins, emotion_step_tokens, fused_label_scores,
                                goal_step_tokens, prompt_keys, reply_markers, reply_starts, sentence_token_classes,
                                turn_ngrams)
from .pretrained import WEIGHTS_NAME, resolve_pretrained, shipped_weights
from .processing import IGNORE_INDEX, EmpatheiaProcessor, EncodedExample, Target, merge_features
from .projector import Projector
from .prompts import ChainOfEmpathy, PromptMode, parse_chain
from .responding import Responder
from .response import EmpatheticResponse, LabelPrediction
from .stages import CCL, EMP, PARAMETER_GROUPS, SAC, Stage, get_stage
from .variants.readers import load_text_readers, text_log_probabilities

CONFIG_NAME = "config.yaml"
TOKENIZER_DIR = "tokenizer"
# Version 1 kept the language model's adapter in WEIGHTS_NAME too (the shipped `small`
# weights still do); version 2 writes it as a PEFT adapter beside it.
WEIGHTS_VERSION = "2"
FUSED_EMOTION_SOURCE = "the Style Disentangler (from the signal tokens), fused with the chain's emotion"
"""``response.emotion_source`` where the style's emotion was fused with the chain's
(``style_disentangler.chain_emotion_prior_weight`` > 0)."""
_LM_PREFIX = "language_model."

_STANDARDIZER_BUFFERS = (".running_mean", ".running_var", ".updates")
# Head options added after weights had been trained and shipped without them:
# (config section, option, the value those weights were trained with, the prefix of the
# option's own weights). A saved config that does not name the option, or weights that
# hold none of its parameters, load with that value, so they give what they gave when
# trained; the refits add each option to such weights (style_refit.add_chain_reading and
# add_class_styles, content_refit.add_unit_context).
ADDED_OPTIONS = (
    ("style_disentangler", "reads_chain_emotion", False, "style_disentangler.chain_"),
    ("style_disentangler", "styles_follow_classes", False, "style_disentangler.class_styles."),
    ("content_synchronizer", "unit_context", 0, "content_synchronizer.unit_context."),
)
_TRAINED_MODULES = ("speech_projector", "video_projector", "content_synchronizer", "style_disentangler")


@dataclass
class GeneratedText:
    """What :meth:`Empatheia.generate_text` returns for a batch of ``B`` dialogues."""

    prompts: List[Any]
    """The encoded prompts (:class:`~empatheia.processing.EncodedExample`)."""
    media: Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]
    """The prompts' projected speech and video features (:meth:`Empatheia.encode_media`)."""
    sequences: torch.Tensor
    """``(B, N)`` generated token ids (padded after a row's end)."""
    texts: List[str]
    scores: Optional[List[torch.Tensor]] = None
    """The logits ``(B, V)`` of each of the first ``score_steps`` generated steps."""
    cache: Optional["GenerationCache"] = None
    """What the generation computed, for the signal pass to reuse (``keep_cache``)."""
    chain_emotion_prior: Optional[torch.Tensor] = None
    """``(B, K)`` what the chain's emotion was fused with (:meth:`Empatheia.chain_emotion_prior`)."""
    chain_emotion_reading: Optional[torch.Tensor] = None
    """``(B, K)`` the chain's emotion as read from the speaker's own words, which the chain
    then wrote (``language_model.chain_emotion_context`` "speaker",
    :meth:`Empatheia.speaker_emotion_reading`); ``None`` when the chain read it after its
    own event step."""


@dataclass
class GenerationCache:
    """The key/value cache that generating a batch left, with the last hidden states and
    token ids of the ``C`` columns it holds: the left-padded prompts (``P`` columns), then
    the generated tokens that were fed back (all but the last)."""

    past_key_values: Any
    """The language model's cache (a transformers ``Cache``) of those ``C`` columns."""
    hidden: torch.Tensor
    """``(B, C, H)`` last hidden states."""
    input_ids: torch.Tensor
    """``(B, C)`` token ids."""
    prompt_lengths: torch.Tensor
    """``(B,)`` real (unpadded) prompt tokens per row."""
    prompt_width: int
    """``P``: the columns of the left-padded prompts, where every prompt ends."""


class Empatheia(nn.Module, Responder):
    """Multimodal empathetic response generation (Empatheia, WWW 2025).

    Build from a preset or a config, train stage by stage with ``model(batch, stage=k)``,
    answer with :meth:`respond`, and save only what was trained with
    :meth:`save_pretrained`::

        model = Empatheia.from_preset("tiny")
        response = model.respond(Dialogue([Turn("speaker", "I lost my job today.")]))
        response.chain.speaker_emotion, response.emotion.probabilities

    Args:
        config: the model's configuration.
        tokenizer_path: load the tokenizer from here (a saved model's ``tokenizer/``)
            instead of the name in the config.
        dtype: dtype of the language model's weights (e.g. ``torch.bfloat16`` for 7B).
    """

    def __init__(
        self,
        config: EmpatheiaConfig,
        tokenizer_path: Optional[Union[str, Path]] = None,
        dtype: Optional[torch.dtype] = None,
    ):
        super().__init__()
        # Set while the adapter is merged into the base weights (merge_adapter): restores them.
        self._restore_adapter: Optional[Callable[[], None]] = None
        self.config = config
        lm_config = config.language_model
        # Random weights come from the config's seed without touching the caller's RNG,
        # so the same config always rebuilds the same base model.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.tokenizer = build_tokenizer(lm_config, tokenizer_path)
            self.token_ids = special_token_ids(self.tokenizer, lm_config)
            self.speech_encoder = SpeechEncoder(config.speech_encoder)
            self.video_encoder = VideoEncoder(config.video_encoder)
            self.language_model = build_language_model(lm_config, self.tokenizer, self.token_ids, dtype)
            width = lm_config.hidden_size
            cap = _embedding_norm(self.language_model) if config.projector.cap_to_embedding_norm else None
            self.speech_projector = Projector(self.speech_encoder.hidden_size, width, config.projector.num_layers,
                                              config.projector.zero_init_output, cap)
            self.video_projector = Projector(self.video_encoder.hidden_size, width, config.projector.num_layers,
                                             config.projector.zero_init_output, cap)
            self.content_synchronizer = ContentSynchronizer(config.content_synchronizer, width)
            self.style_disentangler = StyleDisentangler(config.style_disentangler, width, lm_config.num_signal_tokens)
        self.processor = EmpatheiaProcessor(config, self.tokenizer, self.token_ids)
        self.register_buffer("_audio_signal_ids", torch.tensor(self.token_ids.audio_signals), persistent=False)
        self.register_buffer("_video_signal_ids", torch.tensor(self.token_ids.video_signals), persistent=False)
        emotions = lm_config.chain_emotions
        self.register_buffer("_chain_emotion_ids", chain_emotion_token_ids(self.tokenizer, emotions) if emotions else None,
                             persistent=False)
        self.stage: Optional[Stage] = None
        # Generators and avatars are used by respond, not trained: a plain dict keeps
        # them out of parameters(), state_dict() and .to().
        self._generators: Dict[str, object] = {}
        self._avatar_registry = None
        self._chain_emotion_reader = None  # (path, reader), loaded at its first use (chain_emotion_prior)

    # ================================================================== building
    @classmethod
    def from_preset(
        cls,
        name: str,
        overrides: Optional[Dict[str, object]] = None,
        dtype: Optional[torch.dtype] = None,
        trained: bool = True,
    ) -> "Empatheia":
        """Build a preset (``"tiny"``, ``"small"``, ``"paper"``); ``overrides`` maps dotted
        config keys to values, e.g. ``{"language_model.pretrained": "/models/vicuna-7b-v1.5"}``.

        A preset whose trained weights ship inside the package (:func:`shipped_weights`)
        loads them unless ``trained=False``."""
        config = EmpatheiaConfig.from_preset(name, overrides)
        weights = shipped_weights(name) if trained else None
        state = load_trained_state(weights) if weights is not None else None
        if state is not None:
            for section, option, before, prefix in ADDED_OPTIONS:
                if not any(k.startswith(prefix) for k in state):
                    setattr(getattr(config, section), option, before)
        model = cls(config, dtype=dtype)
        if state is not None:
            model.load_trained_state_dict(state, source=str(weights))
        return model.eval()

    @property
    def device(self) -> torch.device:
        return self.style_disentangler.queries.device

    def _hf_model(self):
        return self.language_model.get_base_model()

    # ================================================================== stages
    fresh_groups = ("projectors", "content_synchronizer", "style_disentangler")
    """The parameter groups that train from scratch (``optim.head_learning_rate``)."""

    def parameter_groups(self) -> Dict[str, List[Tuple[str, nn.Parameter]]]:
        """Every parameter by the group that decides when it trains: ``lora``,
        ``signal_rows`` (the signal tokens' embedding and LM-head rows), ``projectors``,
        ``content_synchronizer``, ``style_disentangler`` (with its classifiers) and
        ``frozen`` (encoders and the base language model)."""
        groups: Dict[str, List[Tuple[str, nn.Parameter]]] = {key: [] for key in PARAMETER_GROUPS + ("frozen",)}
        for name, param in self.named_parameters():
            if name.startswith("language_model."):
                if "lora_" in name:
                    key = "lora"
                elif "trainable_tokens_" in name:
                    key = "signal_rows"
                else:
                    key = "frozen"
            elif name.startswith(("speech_projector.", "video_projector.")):
                key = "projectors"
            elif name.startswith("content_synchronizer."):
                key = "content_synchronizer"
            elif name.startswith("style_disentangler."):
                key = "style_disentangler"
            else:
                key = "frozen"
            groups[key].append((name, param))
        return groups

    def set_stage(self, stage: Union[int, str, Stage]) -> "Empatheia":
        """Make exactly the parameters of ``stage`` trainable (its ``trains``, §5): 1 LoRA
        and signal-token rows; 2 the Content Synchronizer; 3 the projectors, the Style
        Disentangler and its classifiers; 4 LoRA, signal-token rows, the projectors and both
        heads."""
        stage = get_stage(stage)
        for key, params in self.parameter_groups().items():
            for _, param in params:
                param.requires_grad_(key in stage.trains)
        self.stage = stage
        return self

    # ================================================================== labels
    def label_sets(self) -> LabelSets:
        """The classes the Style Disentangler's classifiers predict."""
        sd = self.config.style_disentangler
        return LabelSets.from_config(sd, sd.emotion_fold, sd.emotion_fold_replace)

    def set_label_sets(self, labels: LabelSets) -> "Empatheia":
        """Classify a new dataset's emotions and profile attributes (downstream
        fine-tuning). Classes the model already knows keep their classifier rows; new
        ones start from fresh rows (seeded by the config); the rest of the Style
        Disentangler is kept."""
        sd = self.style_disentangler
        old = self.label_sets()

        reference = sd.emotion_classifier.weight

        def resized(layer: Optional[nn.Linear], old_names: Sequence[str], new_names: Sequence[str]) -> nn.Linear:
            fresh = nn.Linear(sd.config.d_model, len(new_names)).to(reference.device, reference.dtype)
            if layer is None:
                return fresh
            with torch.no_grad():
                for row, name in enumerate(new_names):
                    if name in old_names:
                        fresh.weight[row] = layer.weight[old_names.index(name)]
                        fresh.bias[row] = layer.bias[old_names.index(name)]
            return fresh

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed + 1)
            sd.emotion_classifier = resized(sd.emotion_classifier, old.emotions, labels.emotions)
            heads = nn.ModuleDict()
            for attribute, values in labels.profile.items():
                known = attribute in sd.profile_classifiers
                layer = sd.profile_classifiers[attribute] if known else None
                heads[attribute] = resized(layer, old.profile.get(attribute, []), values)
            sd.profile_classifiers = heads
            if sd.config.styles_follow_classes:
                tables = nn.ModuleDict()
                olds = {"emotion": old.emotions, **old.profile}
                for name, values in {"emotion": labels.emotions, **labels.profile}.items():
                    table = sd.class_style_table(len(values)).to(reference.device, reference.dtype)
                    if name in sd.class_styles:
                        with torch.no_grad():
                            for column, value in enumerate(values):
                                if value in olds[name]:
                                    table.weight[:, column] = sd.class_styles[name].weight[:, olds[name].index(value)]
                    tables[name] = table
                sd.class_styles = tables
        self.config.style_disentangler.emotion_labels = list(labels.emotions)
        self.config.style_disentangler.profile_labels = {k: list(v) for k, v in labels.profile.items()}
        self.config.style_disentangler.emotion_fold = dict(labels.emotion_fold) if labels.emotion_fold is not None else None
        self.config.style_disentangler.emotion_fold_replace = labels.emotion_fold_replace
        if self.stage is not None:
            self.set_stage(self.stage)
        return self

    # ================================================================== merged adapter
    def merge_adapter(self) -> "Empatheia":
        """Fold the LoRA adapter and the signal tokens' rows into the language model's base
        weights (:func:`~empatheia.language_model.merge_adapter`), so that answering runs
        at the plain base model's speed. :meth:`respond` does this itself in eval mode;
        :meth:`train`, moving the model (``.to``) and loading weights undo it, restoring
        the unmerged weights exactly. A 4-bit model stays unmerged."""
        if self._restore_adapter is None and not self.config.language_model.load_in_4bit:
            self._restore_adapter = merge_adapter(self.language_model)
        return self

    def unmerge_adapter(self) -> "Empatheia":
        """Undo :meth:`merge_adapter` (nothing to do when the adapter is not merged)."""
        if self._restore_adapter is not None:
            restore, self._restore_adapter = self._restore_adapter, None
            restore()
        return self

    @property
    def adapter_merged(self) -> bool:
        return self._restore_adapter is not None

    def train(self, mode: bool = True) -> "Empatheia":
        # Merged, the LoRA matrices would get no gradient.
        if mode:
            self.unmerge_adapter()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        # The merge keeps the original weights aside, where .to() and .half() cannot reach.
        self.unmerge_adapter()
        return super()._apply(fn, *args, **kwargs)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        """Recompute the language model's activations in backward to save memory."""
        self._hf_model().gradient_checkpointing_enable(**kwargs)
        self._hf_model().enable_input_require_grads()

    # ================================================================== inputs
    def encode_media(self, batch: Dict[str, torch.Tensor]) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Projected media features ``(N_a, n_a, H)`` and ``(N_v, n_v, H)`` (or ``None``),
        from raw ``audio``/``video``, from complete ``audio_features``/``video_features``
        (encoder outputs ``(N, n, D_enc)``), or from raw media mixed with cached features
        (``{audio,video}_cached`` and ``_order``, see :mod:`empatheia.data.cache`)."""
        # The frozen encoders ignore CPU autocast (bf16 training on the CPU): their
        # features stay the fp32 ones that inference and the media cache have.
        with torch.autocast("cpu", enabled=False):
            audio = batch.get("audio_features")
            if audio is None and ("audio" in batch or "audio_cached" in batch):
                raw = self.speech_encoder(batch["audio"], batch["audio_lengths"]) if "audio" in batch else None
                audio = merge_features(batch, "audio", raw)
            video = batch.get("video_features")
            if video is None and ("video" in batch or "video_cached" in batch):
                raw = self.video_encoder(batch["video"], batch.get("video_lengths")) if "video" in batch else None
                video = merge_features(batch, "video", raw)
        proj_dtype = self.speech_projector.output_layer.weight.dtype
        audio = self.speech_projector(audio.to(proj_dtype)) if audio is not None else None
        video = self.video_projector(video.to(proj_dtype)) if video is not None else None
        return audio, video

    def embed_inputs(
        self, input_ids: torch.Tensor, audio: Optional[torch.Tensor] = None, video: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Token embeddings ``(B, L, H)`` with the ``<Aud>``/``<Vid>`` placeholder rows
        replaced, in order, by the projected media features."""
        embeddings = self.language_model.get_input_embeddings()(input_ids)
        for token, placeholder, features, tokens_per_clip in (
            (AUDIO_PLACEHOLDER, self.token_ids.audio_placeholder, audio, self.config.speech_encoder.num_tokens),
            (VIDEO_PLACEHOLDER, self.token_ids.video_placeholder, video, self.config.video_encoder.num_tokens),
        ):
            mask = input_ids == placeholder
            clips = 0 if features is None else features.shape[0]
            if int(mask.sum()) != clips * tokens_per_clip:
                per_row = (mask.sum(1) / tokens_per_clip).tolist()
                raise ValueError(
                    f"the prompts have {per_row} {token} placeholders per row ({sum(per_row):g} in all, "
                    f"{tokens_per_clip} tokens each) but the batch carries {clips} clips of that modality"
                )
            if clips:
                embeddings = embeddings.masked_scatter(mask.unsqueeze(-1), features.to(embeddings.dtype))
        return embeddings

    def hidden_states(
        self,
        batch: Dict[str, torch.Tensor],
        media: Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = None,
    ) -> torch.Tensor:
        """The language model's last hidden states ``(B, L, H)`` for a batch. Rows may be
        padded on the right (training) or the left (generation); hidden states at padding
        positions are meaningless and never read."""
        audio, video = media if media is not None else self.encode_media(batch)
        embeddings = self.embed_inputs(batch["input_ids"], audio, video)
        decoder = self._hf_model().base_model
        mask = batch["attention_mask"]
        # In a causal model a real token never attends to the padding after it, so with
        # right padding the mask changes nothing that is read; without it, attention runs
        # the fused causal kernel instead of a masked one (about 9 % of a 7B training step).
        if _right_padded(mask):
            mask = None
        # No KV cache in a single full pass: building one costs memory and time for nothing.
        return decoder(inputs_embeds=embeddings, attention_mask=mask, use_cache=False).last_hidden_state

    def signal_states(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Hidden states at ``<AUD1..n>`` and ``<VID1..n>``: two ``(B, n, H)`` tensors."""
        n = self.config.language_model.num_signal_tokens
        out = []
        for name, ids in (("<AUDi>", self._audio_signal_ids), ("<VIDi>", self._video_signal_ids)):
            mask = torch.isin(input_ids, ids)
            counts = mask.sum(1)
            if bool((counts != n).any()):
                raise ValueError(f"each row needs the {n} {name} signal tokens; rows have {counts.tolist()}")
            out.append(hidden[mask].view(input_ids.shape[0], n, -1))
        return out[0], out[1]

    def style_inputs(
        self, hidden: torch.Tensor, batch: Dict[str, torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the Style Disentangler reads from hidden states ``(B, L, H)``: the signal
        states (two ``(B, n, H)``), the hidden state at each row's Chain-of-Empathy
        emotion slot ``(B, H)`` (zeros where the row has none) and which rows have one
        ``(B,)`` bool (from ``batch["emotion_slot"]`` ``(B, L)``; none when the batch has
        no such key)."""
        speech, video = self.signal_states(hidden, batch["input_ids"])
        slot = batch.get("emotion_slot")
        if slot is None:
            slot = torch.zeros(batch["input_ids"].shape, dtype=torch.bool, device=hidden.device)
        has_chain = slot.any(1)
        chain = hidden.new_zeros(hidden.shape[0], hidden.shape[-1])
        chain[has_chain] = hidden[slot]
        return speech, video, chain, has_chain

    # ================================================================== training
    def forward(self, batch: Dict[str, torch.Tensor], stage: Union[int, str, Stage, None] = None) -> Dict[str, torch.Tensor]:
        """Loss of a training stage (§5, :mod:`empatheia.stages`) and each of its terms.

        Batch keys beyond the processor's, by stage:

        * 2 and 4: ``speech_content_target`` ``(B, Ls, D_cs)`` with ``speech_content_mask``
          ``(B, Ls)``, ``video_content_target`` ``(B, Ls, D_cv)`` with
          ``video_content_mask`` ``(B, Ls)`` (C^v has one row per speech content unit,
          so both masks must agree), and with ``content_synchronizer.unit_vocab_size > 0``
          ``speech_units`` ``(B, Ls)`` int64, the speech generator's unit ids;
        * 3 and 4: ``speech_style_target`` ``(B, D_ss)``, ``video_style_target``
          ``(B, D_sv)``, ``emotion_label`` ``(B,)`` and ``{attribute}_label`` ``(B,)`` per
          profile attribute (``-100`` where unknown).

        Returns ``loss`` and: stage 1 ``loss_emp`` (mean token NLL of the target, eq. 8)
        and, with ``loss.chain_emotion_weight`` > 0, ``loss_chain_emotion`` (see
        :meth:`chain_emotion_loss`; stage 4 too), added with that weight, and likewise
        ``loss_chain_goal`` (:meth:`chain_goal_loss`) with ``loss.chain_goal_weight`` and
        (stage 1 alone) ``loss_listener_echo`` (:meth:`listener_echo_loss`, from the
        batch's ``echo_*`` keys) with ``loss.listener_echo_weight``;
        stage 2 ``loss_ccl`` (eq. 9) with its speech/video parts and ``kl_content``;
        stage 3 ``loss_sac = loss_sal + loss_cls`` (eqs. 10-12) with their parts and
        ``kl_style``; stage 4 all of them, ``loss = emp + α ccl + β sac`` (eq. 13), and
        each weighted term as ``weighted_*``. Each VAE's KL is added with weight
        ``loss.kl_weight``.
        """
        if stage is None and self.stage is None:
            raise ValueError("forward needs a stage: pass stage=1, 2, 3 or 4, or call set_stage first")
        stage = get_stage(stage if stage is not None else self.stage)
        missing = [key for key in stage.batch_keys if key not in batch]
        if missing:
            raise KeyError(f"stage {stage.number} needs batch keys {missing}")
        # Stage 2 reads the frozen language model's states without a graph. Stage 3 keeps
        # the model frozen as well (§5.3), but its prompts are media alone, so the gradient
        # passes through it to the projectors: they have no pre-aligned weights (the
        # paper's come from NExT-GPT), and this is the first stage in which the media say
        # anything.
        with torch.set_grad_enabled(torch.is_grad_enabled() and stage.builds_language_model_graph):
            hidden = self.hidden_states(batch)
        terms: Dict[str, torch.Tensor] = {}
        if stage.computes(EMP):
            terms["loss_emp"] = self.language_modeling_loss(hidden, batch["labels"])
            if self.config.loss.chain_emotion_weight:
                terms["loss_chain_emotion"] = self.chain_emotion_loss(hidden, batch["labels"], batch["emotion_slot"])
            if self.config.loss.chain_goal_weight:
                terms["loss_chain_goal"] = self.chain_goal_loss(hidden, batch["labels"], batch["goal_mask"])
            if self.config.loss.listener_echo_weight and stage.has_term("listener_echo"):
                if "echo_input_ids" not in batch:
                    raise KeyError(f"stage {stage.number} with loss.listener_echo_weight > 0 needs the batch keys "
                                   "echo_input_ids, echo_attention_mask and echo_labels (a StageDataset's collator "
                                   "builds them)")
                terms["loss_listener_echo"] = self.listener_echo_loss(batch)
        if stage.computes(CCL):
            speech_lengths = batch["speech_content_mask"].sum(1)
            video_lengths = batch["video_content_mask"].sum(1)
            if not torch.equal(speech_lengths.cpu(), video_lengths.cpu()):
                raise ValueError(
                    f"video_content_target must have one row per speech content unit: video_content_mask has "
                    f"{video_lengths.tolist()} rows, speech_content_mask {speech_lengths.tolist()} "
                    "(stale per-frame gold features? re-extract them)"
                )
            # A text dialogue without gold features (mask all False) still gets one content
            # row, which its masks then leave out of L_ccl.
            content = self.content_synchronizer(
                hidden, batch["response_mask"], speech_lengths.clamp(min=1), batch.get("speech_units")
            )
            terms.update(self.content_losses(content, batch))
        if stage.computes(SAC):
            style = self.style_disentangler(*self.style_inputs(hidden, batch))
            terms.update(self.style_losses(style, batch))
        weighted = self.weighted_terms(terms, stage)
        loss = sum(weighted.values())
        if stage.logs_weighted_terms:
            terms.update({f"weighted_{name}": value.detach() for name, value in weighted.items()})
        return {"loss": loss, **terms}

    def weighted_terms(self, terms: Dict[str, torch.Tensor], stage: Union[int, Stage]) -> Dict[str, torch.Tensor]:
        """The summands of ``stage``'s loss (its :attr:`~empatheia.stages.Stage.terms`),
        each with its weight from ``config.loss`` applied: eq. 8 (stage 1), eq. 9 (2),
        eq. 12 (3) or eq. 13 (4) split into ``emp``, ``ccl``, ``sal`` and ``cls``
        (``sac = sal + cls`` carries β), plus the VAEs' ``kl`` and ``chain_emotion`` where
        they apply. Their sum is the loss."""
        out = {}
        for term in get_stage(stage).terms:
            if term.optional and term.losses[0] not in terms:
                continue
            value = terms[term.losses[0]]
            for name in term.losses[1:]:
                value = value + terms[name]
            out[term.name] = value if term.weight is None else getattr(self.config.loss, term.weight) * value
        return out

    def language_modeling_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean NLL of the target tokens. Logits are computed only at target positions,
        which spares a ``(B, L, vocab)`` tensor."""
        targets = labels[:, 1:]
        mask = targets != IGNORE_INDEX
        if not bool(mask.any()):
            raise ValueError("the batch has no target tokens (all labels are -100)")
        logits = self._hf_model().get_output_embeddings()(hidden[:, :-1][mask])
        return F.cross_entropy(logits.float(), targets[mask])

    def chain_emotion_loss(self, hidden: torch.Tensor, labels: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """Token cross-entropy, over the whole vocabulary, of the emotion's first token:
        the language model's logits from the hidden states ``(B, L, H)`` at each emotion
        slot ``(B, L)`` against the next target in ``labels`` ``(B, L)``. Over the whole
        vocabulary, not only the labels' first tokens: a loss restricted to those ranked
        the labels but let other words win the greedy choice (trained that way, the
        ``small`` chain wrote "helpless", "amazed", "fond" for 9 of 16 held-out examples).
        Slots whose next token is not a target are left out; with none left the loss is 0
        and still part of the graph."""
        rows, cols = slot[:, :-1].nonzero(as_tuple=True)
        following = labels[rows, cols + 1]  # (R,)
        trained = following != IGNORE_INDEX
        if not bool(trained.any()):
            return hidden.sum() * 0.0
        logits = self._hf_model().get_output_embeddings()(hidden[rows[trained], cols[trained]])  # (R, V)
        return F.cross_entropy(logits.float(), following[trained])

    def chain_goal_loss(self, hidden: torch.Tensor, labels: torch.Tensor, goal_mask: torch.Tensor) -> torch.Tensor:
        """Mean token NLL of the chain's goal step alone: the target tokens marked in
        ``goal_mask`` ``(B, L)``, each predicted from the hidden state ``(B, L, H)`` before
        it. In L_emp the goal is about 8 target tokens of 100, and its words are the ones
        the dialogue does not give away (the event and cause steps restate it). Rows
        without a goal step are left out; with none at all the loss is 0 and still part
        of the graph."""
        targets = goal_mask[:, 1:] & (labels[:, 1:] != IGNORE_INDEX)
        if not bool(targets.any()):
            return hidden.sum() * 0.0
        logits = self._hf_model().get_output_embeddings()(hidden[:, :-1][targets])
        return F.cross_entropy(logits.float(), labels[:, 1:][targets])

    def listener_echo_loss(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Unlikelihood of the listener's echo: the mean of ``-log(1 - p)`` over the tokens
        marked in ``batch["echo_labels"]`` ``(B_e, L_e)``, each ``p`` the probability the
        model gives it after ``batch["echo_input_ids"]`` (the prompt and chain, then the
        listener's last turn written as the reply;
        :meth:`~empatheia.processing.EmpatheiaProcessor.listener_echo_example`). The term
        is near 0 where the copy is unlikely already and grows without bound as it becomes
        certain, so it acts on the confident copies (Welleck et al., 2020), and it leaves
        every other continuation to L_emp."""
        if batch["echo_input_ids"].shape[0] == 0:
            return torch.zeros((), device=batch["echo_input_ids"].device)  # no example to echo
        hidden = self.hidden_states({"input_ids": batch["echo_input_ids"], "attention_mask": batch["echo_attention_mask"]})
        targets = batch["echo_labels"][:, 1:]
        mask = targets != IGNORE_INDEX
        if not bool(mask.any()):
            return hidden.sum() * 0.0
        logits = self._hf_model().get_output_embeddings()(hidden[:, :-1][mask]).float()
        likely = logits.log_softmax(-1).gather(1, targets[mask].unsqueeze(1)).squeeze(1).exp()
        # Clamped so that a certain copy gives a large, finite loss rather than inf.
        return -torch.log1p(-likely.clamp(max=1.0 - 1e-6)).mean()

    def content_losses(self, content: ContentOutput, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Eq. 9: each modality's squared distance, summed over features, averaged over
        its valid rows (:func:`_squared_distance`)."""
        speech = _squared_distance(content.speech, batch["speech_content_target"], batch["speech_content_mask"], "speech_content")
        video = _squared_distance(content.video, batch["video_content_target"], batch["video_content_mask"], "video_content")
        return {
            "loss_ccl": speech + video,
            "loss_ccl_speech": speech,
            "loss_ccl_video": video,
            "kl_content": content.kl.mean(),
        }

    def style_losses(self, style: StyleOutput, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Eq. 10 (squared distance per modality, summed over features, averaged over the
        items that have style targets: all, unless ``style_target_mask`` ``(B,)`` says
        otherwise) and eq. 11 (cross-entropy of the emotion and of each profile attribute
        the batch labels, summed). A batch labelling an attribute the classifiers do not
        have is a ``ConfigError``: its label sets are not the model's."""
        rows = batch.get("style_target_mask")
        sal_speech = _squared_distance(style.speech_style, batch["speech_style_target"], rows, "speech_style")
        sal_video = _squared_distance(style.video_style, batch["video_style_target"], rows, "video_style")
        terms = {"loss_sal_speech": sal_speech, "loss_sal_video": sal_video, "loss_sal": sal_speech + sal_video}
        cls = _cross_entropy(style.emotion_logits, batch["emotion_label"])
        terms["loss_cls_emotion"] = cls
        _check_profile_labels(batch, style.profile_logits)
        for name, logits in style.profile_logits.items():
            if f"{name}_label" not in batch:
                continue  # the data's label sets have no such attribute: nothing to learn for it
            term = _cross_entropy(logits, batch[f"{name}_label"])
            terms[f"loss_cls_{name}"] = term
            cls = cls + term
        terms["loss_cls"] = cls
        terms["loss_sac"] = terms["loss_sal"] + cls
        terms["kl_style"] = style.kl.mean()
        return terms

    # ================================================================== generators
    def generators(self):
        """The speech and talking-head generators of ``config.generators``, built on first
        use and kept (they are not part of the trained model)."""
        return self.speech_generator(), self.talking_head()

    def speech_generator(self):
        """The speech generator alone, built on first use: a text answer reads its units,
        and speech needs no talking head (nor its checkpoints)."""
        if "speech" not in self._generators:
            from empatheia.generators.factory import build_speech_generator

            self._generators["speech"] = build_speech_generator(self.config)
        return self._generators["speech"]

    def talking_head(self):
        """The talking-head generator alone, built on first use."""
        if "talking_head" not in self._generators:
            from empatheia.generators.factory import build_talking_head

            self._generators["talking_head"] = build_talking_head(self.config)
        return self._generators["talking_head"]

    def set_generators(self, speech=None, talking_head=None) -> "Empatheia":
        """Use these generators instead of the config's (e.g. already loaded ones)."""
        current = self._generators
        if speech is not None:
            current["speech"] = speech
        if talking_head is not None:
            current["talking_head"] = talking_head
        return self

    def avatars(self):
        """The memory of avatars: register your own with
        ``model.avatars().register(key, portrait, voice)``, where ``key`` is the
        listener's ``id-<ID>`` (see :func:`empatheia.generators.avatars.avatar_key`)."""
        if self._avatar_registry is None:
            from empatheia.generators.avatars import AvatarRegistry

            self._avatar_registry = AvatarRegistry(self.config.generators.avatars)
        return self._avatar_registry

    # ================================================================== answering
    # respond and respond_in_stages are Responder's (empatheia/responding.py), over _answer.
    def generate_text(
        self,
        items: Sequence[Dialogue],
        mode: PromptMode = PromptMode.FULL,
        max_new_tokens: Optional[int] = None,
        decoding: Optional[Decoding] = None,
        reserve_signals: bool = True,
        score_steps: int = 0,
        prefix: Optional[torch.Tensor] = None,
        notes: Optional[Sequence[Optional[str]]] = None,
        keep_cache: bool = False,
        progress: Optional[Callable[[int], None]] = None,
        given_emotions: Optional[Sequence[Optional[str]]] = None,
        restart: Optional[ReplyRestart] = None,
    ) -> GeneratedText:
        """Let the language model write its answer to each dialogue in prompt layout
        ``mode`` (left-padded batch), stopping at the end of the text or where it starts its
        signal tokens. The logits ``(B, V)`` of the first ``score_steps`` generated steps
        are kept too (only those: every step's would hold ``steps x B x V`` floats), as the
        model gave them, before any decoding setting changed them. ``reserve_signals``
        keeps room in ``max_length`` for the signal tokens a second pass appends.

        ``decoding`` (default: greedy with the config's repetition control) says how tokens
        are picked (:class:`~empatheia.decoding.Decoding`); its repetition control reaches
        only the reply, after the lead-in ``mode`` writes before it
        (:func:`~empatheia.logits_processors.reply_markers`), and never the end of text or
        the signal tokens.

        The variants of :mod:`empatheia.variants.prefix` give ``prefix`` ``(B, k, H)``,
        virtual tokens read before each prompt (kept free in ``max_length`` too), and
        ``notes``, one text per dialogue that the prompt carries after the dialogue.

        ``keep_cache`` keeps what the generation computed (:class:`GenerationCache`) for
        :meth:`answer_hidden_states`; ``progress`` is called with the number of tokens
        written so far after each step.

        ``given_emotions`` (one per dialogue; ``None`` in a row lets the model choose)
        makes the chain's emotion step that label of ``language_model.chain_emotions``
        instead of the model's reading, so the rest of the chain and the reply follow a
        known emotion (:func:`empatheia.data.distill.distill_replies`).

        With ``language_model.listener_echo_reanswer`` or ``listener_echo_restarts`` an
        answer that repeats 4 words of the listener's earlier turns is written again
        (:meth:`_reanswer_listener_echoes`, :meth:`_restart_listener_echoes`); ``restart``
        is how: it holds each row to its earlier tokens and may refuse the next one
        (:class:`~empatheia.logits_processors.ReplyRestart`), and a generation given one is
        not written again. The returned ``sequences`` and ``texts`` are the last tries';
        ``scores`` and the cache are the first pass's (:meth:`answer_hidden_states`
        recomputes what a row written again changed)."""
        lm = self.config.language_model
        max_new_tokens = max_new_tokens or lm.max_new_tokens
        reserve = max_new_tokens + (2 * lm.num_signal_tokens + 1 if reserve_signals else 0)
        reserve += prefix.shape[1] if prefix is not None else 0
        notes = list(notes) if notes is not None else [None] * len(items)
        prompts = [self.processor.encode(d, mode, reserve=reserve, notes=n) for d, n in zip(items, notes)]
        batch = _to(self.processor.collate(prompts, padding_side="left"), self.device)
        media = self.encode_media(batch)
        embeddings = self.embed_inputs(batch["input_ids"], *media)
        attention_mask = batch["attention_mask"]
        if prefix is not None:
            # Before the left padding: masked out, padding leaves the prefix's positions
            # and the prompt's right after it, as in training.
            embeddings = torch.cat([prefix.to(embeddings.dtype), embeddings], dim=1)
            attention_mask = torch.cat([attention_mask.new_ones(prefix.shape[:2]), attention_mask], dim=1)
        if keep_cache and prefix is not None:
            raise ValueError("keep_cache is for prompts without a prefix")
        recorder = _FirstLogits(score_steps) if score_steps > 0 else None
        prior = self.chain_emotion_prior(items) if mode in (PromptMode.TEXT, PromptMode.FULL) else None
        reading = None
        if given_emotions is not None:
            prior = self.given_emotion_prior(given_emotions, prior, mode)
        elif self._reads_emotion_from_speaker(mode):
            reading = self.speaker_emotion_reading(items, prompts, media, prior)
            labels = self.config.language_model.chain_emotions
            prior = self.given_emotion_prior([labels[i] for i in reading.argmax(1).tolist()], None, mode)
        processors = [p for p in (recorder, *self._decoding_processors(mode, decoding, prior, prompts, items),
                                  _StepCounter(progress) if progress is not None else None) if p is not None]
        if restart is not None:
            # Before sampling, which must draw among the tokens the restart leaves.
            processors.insert(next((i for i, p in enumerate(processors) if isinstance(p, SeededSampling)),
                                   len(processors)), restart)
        context_free = next((p.context_free for p in processors if isinstance(p, GenericReplyPenalty)), None)
        states: List[torch.Tensor] = []

        def record(module, inputs, output):
            if context_free is None or not context_free.running:
                states.append(output[0])

        hook = self._hf_model().base_model.register_forward_hook(record) if keep_cache else None
        try:
            output = self.language_model.generate(
                inputs_embeds=embeddings,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                # Stop at the end of the text or where the model starts its signal tokens:
                # those are appended by the signal pass rather than decoded one by one.
                eos_token_id=[self.token_ids.eos, self.token_ids.audio_signals[0]],
                pad_token_id=self.token_ids.pad,
                logits_processor=LogitsProcessorList(processors) if processors else None,
                return_dict_in_generate=True,
                # Sampling, when asked, is a processor's (SeededSampling), which leaves one
                # token standing: greedy selection then takes it.
                do_sample=False,
            )
        finally:
            if hook is not None:
                hook.remove()
        texts = self.tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
        cache = None
        if keep_cache:
            hidden = torch.cat(states, dim=1)  # the prefill's columns, then one per fed-back token
            columns = hidden.shape[1]
            cache = GenerationCache(
                past_key_values=output.past_key_values,
                hidden=hidden,
                input_ids=torch.cat([batch["input_ids"], output.sequences], dim=1)[:, :columns],
                prompt_lengths=batch["attention_mask"].sum(1),
                prompt_width=batch["input_ids"].shape[1],
            )
        sequences = output.sequences
        if restart is None and (lm.listener_echo_restarts or lm.listener_echo_reanswer) and reply_markers(self.tokenizer, mode):
            def again(rows: List[int], processor: ReplyRestart, dialogues: Optional[List[Dialogue]] = None) -> GeneratedText:
                return self.generate_text(
                    dialogues or [items[b] for b in rows], mode, max_new_tokens, decoding, reserve_signals,
                    prefix=None if prefix is None else prefix[rows], notes=[notes[b] for b in rows],
                    given_emotions=None if given_emotions is None else [given_emotions[b] for b in rows],
                    restart=processor)

            if lm.listener_echo_reanswer:
                sequences, texts = self._reanswer_listener_echoes(items, mode, prompts, sequences, texts, again)
            if lm.listener_echo_restarts:
                sequences, texts = self._restart_listener_echoes(items, mode, prompts, sequences, texts, again)
        return GeneratedText(prompts, media, sequences, texts, recorder.kept if recorder is not None else None,
                             cache, prior, reading)

    def _reanswer_listener_echoes(self, items: Sequence[Dialogue], mode: PromptMode, prompts: Sequence[EncodedExample],
                                  sequences: torch.Tensor, texts: List[str],
                                  again: Callable[..., GeneratedText]) -> Tuple[torch.Tensor, List[str]]:
        """The generated ``sequences`` ``(B, N)`` and ``texts`` with each reply that repeats a
        run of 4 words of the listener's turns its prompt kept
        (:func:`~empatheia.evaluation.text.listener_echo_start`) written again from the
        speaker's words alone (:func:`~empatheia.dialogue.speaker_words`):
        ``again(rows, restart, dialogues)`` generates those rows' new prompts held to the
        text they wrote before the reply (the chain, so the reading of the dialogue stays),
        the reply left free.

        Why: the core copies the listener's turn because the prompt holds it; the
        speaker's words alone hold nothing of the listener's to copy, and a speaker's
        first turn is the form the core answers best. The signal pass still reads the
        whole dialogue with the new reply."""
        markers = [torch.as_tensor(m) for m in reply_markers(self.tokenizer, mode)]
        rows = self._generated_rows(sequences)
        echoing = [b for b, (d, p) in enumerate(zip(items, prompts))
                   if any(t.role == "speaker" for t in d.turns[p.first_turn:])
                   and self._listener_echo_token(rows[b], markers, [t.text for t in self._listener_turns(d, p)]) is not None]
        if not echoing:
            return sequences, texts
        held = [rows[b][:int(reply_starts(torch.tensor([rows[b]]), markers)[0])] for b in echoing]
        written = again(echoing, ReplyRestart([torch.tensor(h, dtype=torch.long) for h in held], [None] * len(echoing)),
                        [speaker_words(items[b], prompts[b].first_turn) for b in echoing])
        texts = list(texts)
        for i, b in enumerate(echoing):
            rows[b] = self._generated_rows(written.sequences[i:i + 1])[0]
            texts[b] = written.texts[i]
        return self._padded_rows(rows, sequences), texts

    def _listener_turns(self, dialogue: Dialogue, prompt: EncodedExample) -> List[Turn]:
        """The listener's turns with text that ``prompt`` kept of ``dialogue``."""
        return [t for t in dialogue.turns[prompt.first_turn:] if t.role == "listener" and t.text.strip()]

    def _generated_rows(self, sequences: torch.Tensor) -> List[List[int]]:
        """Each generated row of ``sequences`` ``(B, N)`` up to its end (the end of text,
        the padding after it or the first signal token), as a list of token ids."""
        ids = self.token_ids
        ends = {ids.eos, ids.pad, ids.audio_signals[0]}
        return [row[:next((i for i, t in enumerate(row) if t in ends), len(row))] for row in sequences.tolist()]

    def _padded_rows(self, rows: List[List[int]], like: torch.Tensor) -> torch.Tensor:
        """``rows`` as one ``(B, N')`` tensor of ``like``'s type and device, padded."""
        merged = torch.full((len(rows), max(max(map(len, rows)), 1)), self.token_ids.pad, dtype=like.dtype, device=like.device)
        for b, row in enumerate(rows):
            merged[b, :len(row)] = torch.tensor(row, dtype=like.dtype)
        return merged

    def _restart_listener_echoes(self, items: Sequence[Dialogue], mode: PromptMode, prompts: Sequence[EncodedExample],
                                 sequences: torch.Tensor, texts: List[str],
                                 again: Callable[[List[int], ReplyRestart], GeneratedText]) -> Tuple[torch.Tensor, List[str]]:
        """The generated ``sequences`` ``(B, N)`` and ``texts`` with each answer that repeats a
        run of 4 words of the listener's turns its prompt kept
        (:func:`~empatheia.evaluation.text.listener_echo_start`) written again, up to
        ``language_model.listener_echo_restarts`` times: ``again(rows, restart)`` generates
        those rows held to their tokens before the copy, the copy's first token refused
        there (and, when the next try copies from the same point, every token refused
        there so far). Only the rows that still copy go on; the last try stays.

        Why: the n-gram block on the listener's words (:class:`ListenerEchoBlock`) cuts the
        copy at its n-th token, after the model has committed to the phrase, and it
        rewords the copy; refused at the copy's first token, the model chooses its words
        again from a clean point."""
        markers = [torch.as_tensor(m) for m in reply_markers(self.tokenizer, mode)]
        said = [[t.text for t in self._listener_turns(d, p)] for d, p in zip(items, prompts)]
        rows = self._generated_rows(sequences)
        texts = list(texts)
        restarted: Dict[int, Tuple[List[int], Set[int]]] = {}  # row -> (tokens held, tokens refused after them)
        pending = [b for b in range(len(items)) if said[b]]
        for _ in range(self.config.language_model.listener_echo_restarts):
            echoing = []
            for b in pending:
                at = self._listener_echo_token(rows[b], markers, said[b])
                if at is None:
                    continue
                held, token = rows[b][:at], rows[b][at]
                before = restarted.get(b)
                restarted[b] = (held, (before[1] if before is not None and before[0] == held else set()) | {token})
                echoing.append(b)
            if not echoing:
                break
            written = again(echoing, ReplyRestart([torch.tensor(restarted[b][0], dtype=torch.long) for b in echoing],
                                                  [torch.tensor(sorted(restarted[b][1])) for b in echoing]))
            for i, b in enumerate(echoing):
                rows[b] = self._generated_rows(written.sequences[i:i + 1])[0]
                texts[b] = written.texts[i]
            pending = echoing
        if not restarted:
            return sequences, texts
        return self._padded_rows(rows, sequences), texts

    def _listener_echo_token(self, tokens: List[int], markers: Sequence[torch.Tensor], said: Sequence[str]) -> Optional[int]:
        """The index in ``tokens`` (one generated row, without its end) of the token where
        the reply's first run of 4 words shared with ``said`` begins; ``None`` when the
        reply (its first line, the response) shares none or there is no reply yet."""
        start = int(reply_starts(torch.tensor([tokens], dtype=torch.long), markers)[0]) if tokens else 0
        reply = tokens[start:]
        if not reply:
            return None
        text = self.tokenizer.decode(reply, skip_special_tokens=True).split("\n", 1)[0]
        offset = listener_echo_start(said, text)
        if offset is None:
            return None
        for k in range(len(reply)):
            if len(self.tokenizer.decode(reply[:k + 1], skip_special_tokens=True)) > offset:
                return start + k
        return None

    def _reads_emotion_from_speaker(self, mode: PromptMode) -> bool:
        lm = self.config.language_model
        return (lm.chain_emotion_context == "speaker" and mode in (PromptMode.TEXT, PromptMode.FULL)
                and lm.choose_chain_emotion and bool(lm.chain_emotions))

    @torch.no_grad()
    def speaker_emotion_reading(self, items: Sequence[Dialogue], prompts: Sequence[EncodedExample],
                                media: Tuple[Optional[torch.Tensor], Optional[torch.Tensor]],
                                prior: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(B, K)`` the chain's emotion read from the speaker's own words: the language
        model's log-probabilities of ``language_model.chain_emotions`` at the emotion step of
        a chain whose event step holds the speaker's first turn of each prompt (``prompts``,
        with their projected ``media``), fused with ``prior`` (:meth:`chain_emotion_scores`).
        One teacher-forced pass; nothing is generated.

        Why: the event step a four-step core writes tells the event in fewer words, and the
        words it drops are often the ones that carry the feeling; read after the
        speaker's own account, the same core names the emotion more often right
        (docs/small_preset.md, "The chain's emotion read from the speaker's words")."""
        placeholder = self.config.language_model.chain_emotions[0]
        encoded = []
        for dialogue, prompt in zip(items, prompts):
            kept = dialogue.turns[prompt.first_turn:]
            words = next((t.text for t in kept if t.role == "speaker" and t.text.strip()), "")
            # Within the room the generation kept for its chain: an event step as long as a
            # chain's whole budget would not fit.
            words = " ".join(words.split()[:SPEAKER_EVENT_WORDS])
            chain = ChainOfEmpathy(event_scenario=words, speaker_emotion=placeholder)
            encoded.append(self.processor.encode(dialogue, PromptMode.FULL, Target(chain=chain, signals=False, eos=False),
                                                 first_turn=prompt.first_turn, load_media=False))
        batch = _to(self.processor.collate(encoded), self.device)
        hidden = self.hidden_states(batch, media=media)
        return self.chain_emotion_scores(hidden, batch["emotion_slot"], prior)

    def chain_emotion_prior(self, items: Sequence[Dialogue]) -> Optional[torch.Tensor]:
        """``(B, K)`` the reading of ``language_model.chain_emotion_reader`` for each
        dialogue, as log-probabilities over ``language_model.chain_emotions`` times
        ``chain_emotion_reader_weight``: added to the language model's log-probabilities of
        the labels where the chain's emotion is chosen and reported, it multiplies the
        distributions. The readers (every one the folder holds, their distributions
        multiplied) read the speaker's words; a dialogue where the speaker said nothing
        gets zeros (the language model's reading alone). ``None`` without a reader or at
        weight 0.

        Why more readers: on held-out EmpatheticDialogues the language model and readers
        fitted on the same training split err on different dialogues, and their product
        is right more often than any of them (docs/small_preset.md)."""
        lm = self.config.language_model
        if not lm.chain_emotion_reader or not lm.chain_emotions or lm.chain_emotion_reader_weight == 0:
            return None
        if self._chain_emotion_reader is None or self._chain_emotion_reader[0] != lm.chain_emotion_reader:
            path = resolve_pretrained(lm.chain_emotion_reader)
            self._chain_emotion_reader = (lm.chain_emotion_reader, load_text_readers(path))
        try:
            read = text_log_probabilities(self._chain_emotion_reader[1], items, lm.chain_emotions)  # (B, K)
        except ValueError as error:
            raise ValueError(f"language_model.chain_emotion_reader {lm.chain_emotion_reader}: {error}") from None
        return (read * lm.chain_emotion_reader_weight).to(self.device)

    def given_emotion_prior(self, emotions: Sequence[Optional[str]], prior: Optional[torch.Tensor],
                            mode: PromptMode = PromptMode.FULL) -> torch.Tensor:
        """``(B, K)`` scores that make the chain's emotion choice
        (:class:`~empatheia.logits_processors.ChainEmotionChoice`) take ``emotions[b]`` in row
        ``b``: 0 for that label, ``-inf`` for the others. A row whose emotion is ``None`` keeps
        ``prior``'s row (zeros without one: the model's own reading)."""
        lm = self.config.language_model
        if mode not in (PromptMode.TEXT, PromptMode.FULL) or not lm.choose_chain_emotion or not lm.chain_emotions:
            raise ValueError("given emotions need a chain whose emotion is chosen among labels: a TEXT or FULL "
                             "prompt and language_model.choose_chain_emotion with language_model.chain_emotions")
        labels = [normalize_label(label) for label in lm.chain_emotions]
        scores = prior.clone() if prior is not None else torch.zeros(len(emotions), len(labels), device=self.device)
        if scores.shape[0] != len(emotions):
            raise ValueError(f"{len(emotions)} given emotions for {scores.shape[0]} dialogues")
        for row, emotion in enumerate(emotions):
            if emotion is None:
                continue
            key = normalize_label(emotion)
            if key not in labels:
                raise ValueError(f"given emotion {emotion!r} is not one of language_model.chain_emotions "
                                 f"({', '.join(labels)})")
            scores[row] = float("-inf")
            scores[row, labels.index(key)] = 0.0
        return scores

    def _context_free_scorer(self, mode: PromptMode, items: Optional[Sequence[Dialogue]] = None,
                             prompts: Optional[Sequence[EncodedExample]] = None
                             ) -> Optional[Union[ContextFreeScorer, ListenerTurnScorer]]:
        """The scorer of what the language model writes after the prompt of layout
        ``mode`` without a dialogue and the reply's lead-in (the form it takes without a
        chain); with ``language_model.generic_reply_context`` "listener" (and the batch's
        ``items`` and ``prompts``), after each row's prompt with the listener's turns alone
        (:class:`ListenerTurnScorer`). ``None`` for layouts without a reply."""
        markers = reply_markers(self.tokenizer, mode)
        if not markers:
            return None
        lead = torch.as_tensor(markers[-1])
        if self.config.language_model.generic_reply_context == "listener" and items is not None and prompts is not None:
            contexts = [torch.cat([self.processor.context_free_prompt_ids(mode, self._listener_turns(d, p)), lead])
                        for d, p in zip(items, prompts)]
            return ListenerTurnScorer(self.language_model, contexts, self.token_ids.pad)
        context = torch.cat([self.processor.context_free_prompt_ids(mode), lead])
        return ContextFreeScorer(self.language_model, context.to(self.device))

    def _decoding_processors(self, mode: PromptMode, decoding: Optional[Decoding],
                             emotion_prior: Optional[torch.Tensor] = None,
                             prompts: Optional[Sequence[EncodedExample]] = None,
                             items: Optional[Sequence[Dialogue]] = None) -> List[LogitsProcessor]:
        """The logits processors of ``decoding`` (its ``None`` settings the config's) for a
        generation in layout ``mode``: the n-gram block within each step of the chain, the
        chain's template and the choice of its emotion (fused with ``emotion_prior``,
        :meth:`chain_emotion_prior`) where the config asks for them, the block on repeated
        sentences, the reply's repetition control and least length, the block on the
        listener's earlier words
        (:meth:`_listener_ngrams`), the penalty on generic openings (scored
        by :meth:`_context_free_scorer`), then sampling (each row drawing
        by its prompt's key, :func:`~empatheia.logits_processors.prompt_keys`, so a dialogue
        draws alike in any batch)."""
        if decoding is not None and not isinstance(decoding, Decoding):
            raise TypeError(f"decoding must be a Decoding, got {type(decoding).__name__}")
        lm = self.config.language_model
        decoding = (decoding or Decoding()).resolved(lm)
        processors: List[LogitsProcessor] = []
        chain = mode in (PromptMode.TEXT, PromptMode.FULL)
        ids = self.token_ids
        stops = [ids.eos, *ids.audio_signals, *ids.video_signals]  # never blocked: the model can always stop
        markers = reply_markers(self.tokenizer, mode)  # empty for layouts without a reply
        # First, so that the template and the emotion choice below override what it blocks.
        if decoding.no_repeat_ngram_size and mode in (PromptMode.TEXT, PromptMode.FULL, PromptMode.PIPELINE):
            processors.append(ChainStepNgramBlock(markers, decoding.no_repeat_ngram_size,
                                                  self._sentence_token_classes()[3], protected=stops))
        if lm.force_chain_template and chain:
            processors.append(ChainTemplate(chain_lead_ins(self.tokenizer), self._sentence_token_classes()[3]))
        # Before the emotion choice, whose forced label (line break and all) must stand.
        if decoding.block_repeated_sentences and mode in (PromptMode.TEXT, PromptMode.FULL, PromptMode.PIPELINE):
            processors.append(SentenceRepetitionBlock(markers, *self._sentence_token_classes(), closing=stops))
        if lm.choose_chain_emotion and chain:
            marker, spellings = emotion_step_tokens(self.tokenizer, lm.chain_emotions)
            processors.append(ChainEmotionChoice(marker, spellings, emotion_prior))
            if lm.choose_chain_goal:
                processors.append(self._chain_goal_choice(marker, [s[0] for s in spellings], items))
        if decoding.controls_repetition and markers:
            processors.append(ReplyRepetitionControl(markers, decoding.no_repeat_ngram_size,
                                                     decoding.repetition_penalty, protected=stops))
        if lm.min_reply_tokens and markers:
            # A reply is one line: a line break ends it as the end of text does.
            line_breaks = self._sentence_token_classes()[3].nonzero().squeeze(1).tolist()
            processors.append(ReplyMinLength(markers, lm.min_reply_tokens, stops + line_breaks))
        if lm.no_repeat_listener_ngram_size and items is not None and prompts is not None and markers:
            processors.append(ListenerEchoBlock(markers, self._listener_ngrams(items, prompts), protected=stops))
        # After the reply's blocks, so an opening they cut short still goes on; before the
        # penalty on generic openings and sampling, which choose among the openings.
        if lm.open_reply_by_goal and chain and lm.choose_chain_emotion and lm.choose_chain_goal:
            processors.append(self._reply_goal_openings(mode))
        context_free = self._context_free_scorer(mode, items, prompts) if decoding.generic_reply_penalty else None
        if context_free is not None:
            # After the blocks: only tokens they allow compete for plausibility.
            processors.append(GenericReplyPenalty(context_free, markers, decoding.generic_reply_penalty,
                                                  lm.generic_reply_tokens, protected=stops))
        if decoding.do_sample:
            keys = None if prompts is None else prompt_keys([p.input_ids.tolist() for p in prompts])
            processors.append(SeededSampling(decoding.temperature, decoding.top_p, decoding.seed,
                                             reply_only=None if decoding.sample_chain else markers, keys=keys))
        return processors

    def _listener_ngrams(self, items: Sequence[Dialogue], prompts: Sequence[EncodedExample]) -> List[torch.Tensor]:
        """One ``(K_b, n)`` tensor per dialogue: the ``language_model.no_repeat_listener_ngram_size``
        -grams of the listener turns its prompt kept (:func:`~empatheia.logits_processors.turn_ngrams`)."""
        n = self.config.language_model.no_repeat_listener_ngram_size
        return [turn_ngrams(self.tokenizer, [t.text for t in self._listener_turns(d, p)], n) for d, p in zip(items, prompts)]

    def _chain_goal_choice(self, emotion_marker: Sequence[int], label_firsts: Sequence[int],
                           items: Optional[Sequence[Dialogue]] = None) -> ChainGoalChoice:
        """:class:`~empatheia.logits_processors.ChainGoalChoice` over the goals that fit each
        of ``language_model.chain_emotions`` (:meth:`_goal_choices`), each row's goal
        opening as the targets' rules open it after the speaker's last turn in ``items``
        (:func:`~empatheia.chain_targets.goal_lead`; any opening without ``items``)."""
        marker, spellings, allowed, goal_leads, goals = self._goal_choices()
        weight = self.config.language_model.chain_goal_prior_weight
        prior = dict(prior=self._goal_prior(goals), prior_weight=weight) if weight else {}
        if items is None:
            return ChainGoalChoice(marker, spellings, allowed, emotion_marker, label_firsts, **prior)
        row_leads = torch.tensor([GOAL_LEADS.index(goal_lead(_last_speaker_text(d))) for d in items], dtype=torch.long)
        return ChainGoalChoice(marker, spellings, allowed, emotion_marker, label_firsts, goal_leads, row_leads, **prior)

    def _goal_prior(self, goals: Sequence[str]) -> torch.Tensor:
        """``(K, N)`` how often listeners' replies to each of ``language_model.chain_emotions``
        did each goal's acts (``chain_goal_acts``' ``goal_counts``, the label's row else its
        class's), plus one half so that no goal the table allows is ruled out; read once per
        table."""
        lm = self.config.language_model
        key = (lm.chain_goal_acts, tuple(lm.chain_emotions), tuple(goals))
        cached = getattr(self, "_goal_prior_parts", None)
        if cached is None or cached[0] != key:
            counts = self._goal_table(load_goal_counts)
            keys = [act_key(goal_acts(goal)) for goal in goals]
            rows = [[emotion_row(counts, label, {}).get(k, 0) + 0.5 for k in keys] for label in lm.chain_emotions]
            cached = self._goal_prior_parts = (key, torch.tensor(rows, dtype=torch.float))
        return cached[1]

    def _goal_choices(self):
        """``(marker, spellings, allowed, goal_leads, goals)``: the goal step's lead-in, every
        goal that fits one of ``language_model.chain_emotions`` by
        ``language_model.chain_goal_acts`` (its text and token ids), which labels each fits
        ``(K, N)`` and which lead each opens with ``(N,)``; built once per table (it
        tokenizes every goal)."""
        lm = self.config.language_model
        key = (lm.chain_goal_acts, tuple(lm.chain_emotions))
        cached = getattr(self, "_goal_choice_parts", None)
        if cached is None or cached[0] != key:
            table = self._goal_table(load_goal_acts)
            # goal -> (its lead, the labels it fits)
            fits: Dict[str, Tuple[int, set]] = {}
            for row, label in enumerate(lm.chain_emotions):
                for lead, opening in enumerate(GOAL_LEADS):
                    for goal in goal_repertoire(fitting_acts(table, label), label, leads=[opening]):
                        fits.setdefault(goal, (lead, set()))[1].add(row)
            goals = list(fits)
            allowed = torch.zeros(len(lm.chain_emotions), len(goals), dtype=torch.bool)
            for column, goal in enumerate(goals):
                allowed[sorted(fits[goal][1]), column] = True
            goal_leads = torch.tensor([fits[goal][0] for goal in goals], dtype=torch.long)
            marker, spellings = goal_step_tokens(self.tokenizer, goals)
            cached = self._goal_choice_parts = (key, (marker, spellings, allowed, goal_leads, goals))
        return cached[1]

    def _goal_table(self, load: Callable[[Path], Any]) -> Any:
        """What ``load`` (one of chain_targets' goal-acts readers) reads from
        ``language_model.chain_goal_acts``; its errors name the setting."""
        try:
            return load(resolve_pretrained(self.config.language_model.chain_goal_acts))
        except ValueError as error:
            raise ValueError(f"language_model.chain_goal_acts: {error}") from None

    def _reply_goal_openings(self, mode: PromptMode) -> ReplyGoalOpenings:
        """:class:`~empatheia.logits_processors.ReplyGoalOpenings` over the goals
        :meth:`_chain_goal_choice` lets the chain write and the openings
        ``language_model.chain_goal_acts`` lists for their acts (tokenized once per table)."""
        lm = self.config.language_model
        key = (lm.chain_goal_acts, tuple(lm.chain_emotions))
        marker, spellings, _, _, goals = self._goal_choices()
        parts = getattr(self, "_reply_opening_parts", None)
        if parts is None or parts[0] != key:
            openings = self._goal_table(load_act_openings)
            acts = list(openings)
            # A goal's acts in order, up to the first the table has no openings for: sentence
            # k opens act k.
            named = []
            for goal in goals:
                named.append([])
                for act in goal_acts(goal):
                    if act not in openings:
                        break
                    named[-1].append(acts.index(act))
            width = max(1, max(len(n) for n in named))
            table = torch.full((len(goals), width), -1, dtype=torch.long)
            for row, indices in enumerate(named):
                table[row, :len(indices)] = torch.tensor(indices, dtype=torch.long)
            # As a reply writes them: after the lead-in's space, or after a sentence's end.
            spelled = [(acts.index(act), self.tokenizer(" " + text, add_special_tokens=False)["input_ids"])
                       for act, texts in openings.items() for text in texts]
            parts = self._reply_opening_parts = (key, table, spelled)
        _, table, spelled = parts
        return ReplyGoalOpenings(marker, spellings, table, spelled, reply_markers(self.tokenizer, mode),
                                 self._sentence_token_classes()[1], bonus=lm.reply_opening_bonus)

    def _sentence_token_classes(self):
        """:func:`~empatheia.logits_processors.sentence_token_classes` of this model's
        tokenizer over its output width, worked out once (it decodes every token)."""
        if getattr(self, "_sentence_classes", None) is None:
            width = self._hf_model().get_output_embeddings().weight.shape[0]
            self._sentence_classes = sentence_token_classes(self.tokenizer, width)
        return self._sentence_classes

    def answer_hidden_states(self, batch: Dict[str, torch.Tensor], written: GeneratedText) -> torch.Tensor:
        """The language model's last hidden states ``(B, L, H)`` of ``batch`` (right-padded
        rows: each prompt, the text it was answered with, as the template writes it, and the
        signal tokens), equal to :meth:`hidden_states` of it, but computed only where the
        generation (``written``, made with ``keep_cache``) did not already compute them.

        A row's columns are reused as far as its tokens agree with what was generated,
        which, when the text round-trips through the template, is everything before the
        signal tokens; the rest (the signal tokens, plus any text the template writes
        differently) runs through the model on top of the cache. A batch whose prompts
        differ from the generation's runs whole."""
        cache = written.cache
        if cache is None:
            return self.hidden_states(batch, media=written.media)
        ids, mask = batch["input_ids"], batch["attention_mask"].bool()
        rows, length = ids.shape
        width = cache.input_ids.shape[1]  # C
        device = ids.device
        # Row r's token t sits at cache column offset[r] + t (its prompt ends at column P).
        offset = cache.prompt_width - cache.prompt_lengths  # (B,)
        position = torch.arange(length, device=device).expand(rows, -1)  # (B, L)
        column = position + offset[:, None]
        in_cache = column < width
        agree = in_cache & mask & (cache.input_ids.gather(1, column.clamp(max=width - 1)) == ids)
        reused = agree.long().cumprod(dim=1).sum(dim=1)  # (B,) leading tokens the cache holds
        if bool((reused < cache.prompt_lengths).any()):
            return self.hidden_states(batch, media=written.media)
        remaining = mask.sum(1) - reused  # (B,)
        steps = int(remaining.max())
        states = cache.hidden
        if steps > 0:
            step = torch.arange(steps, device=device).expand(rows, -1)  # (B, S)
            new_mask = step < remaining[:, None]
            new_ids = ids.gather(1, (reused[:, None] + step).clamp(max=length - 1)).masked_fill(~new_mask, self.token_ids.pad)
            # Cached columns after a row's agreeing tokens (text written differently, or
            # padding after the row stopped) are masked out, like its left padding.
            cache_column = torch.arange(width, device=device).expand(rows, -1)
            cache_mask = (cache_column >= offset[:, None]) & (cache_column < (offset + reused)[:, None])
            decoder = self._hf_model().base_model
            new = decoder(
                inputs_embeds=self.embed_inputs(new_ids),  # past the prompt: no media placeholders
                attention_mask=torch.cat([cache_mask, new_mask], dim=1).long(),
                position_ids=reused[:, None] + step,
                past_key_values=cache.past_key_values,
                use_cache=True,
            ).last_hidden_state  # (B, S, H)
            states = torch.cat([states, new], dim=1)  # (B, C + S, H)
        source = torch.where(position < reused[:, None], column, width + position - reused[:, None])
        source = source.clamp(max=states.shape[1] - 1)  # padding positions: never read
        return states.gather(1, source.unsqueeze(-1).expand(-1, -1, states.shape[-1]))

    def label_predictions(self, logits: torch.Tensor,
                          prior: Optional[torch.Tensor] = None) -> List[Optional[LabelPrediction]]:
        """Next-token logits ``(B, V)`` as distributions over
        ``language_model.chain_emotions`` (restricted to the labels' first tokens and
        renormalised, fused with ``prior`` ``(B, K)`` where given); ``None`` for every row
        when no labels are configured."""
        if self._chain_emotion_ids is None:
            return [None] * logits.shape[0]
        scores = fused_label_scores(logits[:, self._chain_emotion_ids], prior)
        return _predictions(scores, self.config.language_model.chain_emotions)

    def _network(self) -> nn.Module:
        return self

    def _answer(self, items, max_new_tokens, decoding, speech_lengths, speak, progress=None):
        """The language model writes the Chain of Empathy and the response (with the
        adapter merged, :meth:`merge_adapter`, unless training); then the 32 signal tokens
        run through it on top of the generation's cache (:meth:`answer_hidden_states`), and
        the hidden states of the whole sequence feed the Content Synchronizer (response
        tokens) and the Style Disentangler (signal tokens), and, with
        ``language_model.chain_emotions``, give ``response.chain_emotion``
        (:meth:`chain_emotion_scores`), which the Style Disentangler's emotion is fused
        with (:meth:`style_emotion_prior`). ``speech_lengths`` gives the content lengths
        per dialogue (speech units: rows of C^s and of C^v); by default the speech
        generator gives them when speaking or when the Content Synchronizer reads unit ids
        (``unit_vocab_size > 0``, then the generator's ``content_units`` of each
        response), and they are otherwise estimated from the response's length.

        Spoken (:meth:`respond` with ``speak``), C^s and S^s drive the voice; animated, the
        talking head spreads the per-unit C^v over the video frames by the speech's
        alignment (which unit sounds when), so the mouth follows the speech that was
        actually generated."""
        device = self.device
        if not self.training:
            self.merge_adapter()
        written = self.generate_text(items, PromptMode.FULL, max_new_tokens, decoding, keep_cache=True,
                                     progress=progress)
        prompts, texts = written.prompts, written.texts
        parsed = [parse_chain(text) for text in texts]

        full = [
            self.processor.encode(
                d,
                PromptMode.FULL,
                Target(response=response, chain=chain, signals=True, eos=False),
                first_turn=prompt.first_turn,
                load_media=False,  # their features are already in `media`
            )
            for d, prompt, (chain, response) in zip(items, prompts, parsed)
        ]
        speech_units = None
        if self.config.content_synchronizer.unit_vocab_size > 0:
            # The generator knows the units of the text it will read: their ids feed the
            # content queries and their count is the content length.
            units = [self.speech_generator().content_units(response) for _, response in parsed]
            units = [u if u.numel() else torch.zeros(1, dtype=torch.long) for u in units]
            counts = [int(u.numel()) for u in units]
            if speech_lengths is not None and list(speech_lengths) != counts:
                raise ValueError(
                    f"speech_lengths {list(speech_lengths)} differ from the speech generator's units {counts}; "
                    "with content_synchronizer.unit_vocab_size > 0 the generator decides them"
                )
            speech_lengths = counts
            speech_units = torch.nn.utils.rnn.pad_sequence(units, batch_first=True).to(device)
        elif speak and speech_lengths is None:
            # The Content Synchronizer writes exactly the phonemes the voice will read.
            speech_lengths = [max(1, self.speech_generator().content_length(response)) for _, response in parsed]
        full_batch = _to(self.processor.collate(full), device)
        hidden = self.answer_hidden_states(full_batch, written)
        emotion_prior, reading = written.chain_emotion_prior, written.chain_emotion_reading
        del written  # its key/value cache is no longer needed: free it before the heads run
        if speech_lengths is None:
            speech_lengths = self.content_synchronizer.estimate_lengths(full_batch["response_chars"])
        speech_lengths = torch.as_tensor(speech_lengths, device=device)
        content = self.content_synchronizer(hidden, full_batch["response_mask"], speech_lengths, speech_units)
        chain_scores = self.chain_emotion_scores(hidden, full_batch["emotion_slot"], emotion_prior)
        if reading is not None and chain_scores is not None:
            # The chain wrote the label read from the speaker's words: report that reading
            # (rows whose chain has no emotion step stay without one).
            chain_scores = torch.where(chain_scores.isnan().any(1, keepdim=True), chain_scores, reading.float())
        style_prior = self.style_emotion_prior(chain_scores)
        style = self.style_disentangler(*self.style_inputs(hidden, full_batch), emotion_prior=style_prior)
        chain_emotions = self._chain_label_predictions(chain_scores, len(items))
        source = FUSED_EMOTION_SOURCE if style_prior is not None else None
        return self._package(items, prompts, texts, parsed, content, style, chain_emotions, source)

    def chain_emotion_scores(self, hidden: torch.Tensor, slot: torch.Tensor,
                             prior: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """``(B, K)`` the Chain of Empathy's emotion as log-probabilities over the K
        ``language_model.chain_emotions``: the language model's next-token probabilities at
        each row's emotion slot ``(B, L)`` (hidden states ``(B, L, H)``), restricted to the
        labels' first tokens and renormalised, fused with ``prior`` ``(B, K)`` where given
        (:meth:`chain_emotion_prior`; the choice the chain wrote). Rows without the step are
        NaN; ``None`` when no labels are configured."""
        if self._chain_emotion_ids is None:
            return None
        has_step = slot.any(1)
        scores = hidden.new_full((slot.shape[0], len(self._chain_emotion_ids)), float("nan"), dtype=torch.float32)
        if bool(has_step.any()):
            logits = self.language_model.get_output_embeddings()(hidden[slot])  # (R, V), R = rows with the step
            scores[has_step] = fused_label_scores(logits[:, self._chain_emotion_ids],
                                                  None if prior is None else prior[has_step])
        return scores

    def chain_emotion_predictions(self, hidden: torch.Tensor, slot: torch.Tensor,
                                  prior: Optional[torch.Tensor] = None) -> List[Optional[LabelPrediction]]:
        """The chain's emotion per row (:meth:`chain_emotion_scores`, which takes the same
        arguments): ``None`` for a row without the step, and for every row when no labels
        are configured."""
        return self._chain_label_predictions(self.chain_emotion_scores(hidden, slot, prior), slot.shape[0])

    def _chain_label_predictions(self, scores: Optional[torch.Tensor], rows: int) -> List[Optional[LabelPrediction]]:
        if scores is None:
            return [None] * rows
        has_step = ~scores.isnan().any(1)
        predictions = iter(_predictions(scores[has_step], self.config.language_model.chain_emotions))
        return [next(predictions) if row else None for row in has_step.tolist()]

    def style_emotion_prior(self, chain_scores: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """``(B, E)`` what the Style Disentangler's emotion is fused with at inference: the
        chain's emotion ``(B, K)`` log-probabilities (:meth:`chain_emotion_scores`), its
        probabilities summed over the chain labels of each of the E classes
        (:meth:`label_sets`' fold), as log-probabilities times
        ``style_disentangler.chain_emotion_prior_weight``. The mass on chain labels the fold
        does not reach says nothing about the classes, so it is spread evenly over them.
        Zeros for a row without the step; ``None`` when the weight is 0 or there are no
        labels."""
        weight = self.config.style_disentangler.chain_emotion_prior_weight
        if chain_scores is None or weight == 0:
            return None
        labels = self.label_sets()
        fold = torch.zeros(chain_scores.shape[1], len(labels.emotions), device=chain_scores.device)  # (K, E)
        for row, label in enumerate(self.config.language_model.chain_emotions):
            try:
                fold[row, labels.emotion_index(label)] = 1.0
            except UnknownEmotionError:
                pass
        has_step = ~chain_scores.isnan().any(1, keepdim=True)  # (B, 1)
        probabilities = chain_scores.exp().nan_to_num(0.0)  # (B, K)
        unread = probabilities @ (1.0 - fold.sum(1, keepdim=True))  # (B, 1) on labels of no class
        mass = probabilities @ fold + unread / fold.shape[1]  # (B, E)
        # The floor keeps a class the chain rules out finite for the fusion after it.
        prior = (mass / mass.sum(1, keepdim=True).clamp_min(1e-12)).clamp_min(1e-12).log() * weight
        return torch.where(has_step, prior, torch.zeros_like(prior))

    def _package(self, items, prompts, texts, parsed, content: ContentOutput, style: StyleOutput,
                 chain_emotions: Sequence[Optional[LabelPrediction]],
                 emotion_source: Optional[str] = None) -> List[EmpatheticResponse]:
        sd = self.config.style_disentangler
        emotion = _predictions(style.emotion_logits, sd.emotion_labels)
        profiles = {name: _predictions(style.profile_logits[name], values) for name, values in sd.profile_labels.items()}
        responses = []
        for i, (dialogue, text, (chain, response)) in enumerate(zip(items, texts, parsed)):
            responses.append(
                EmpatheticResponse(
                    text=response,
                    chain=chain,
                    emotion=emotion[i],
                    chain_emotion=chain_emotions[i],
                    profile={name: preds[i] for name, preds in profiles.items()},
                    speech_content=content.speech[i, content.speech_mask[i]].float().cpu(),
                    speech_style=style.speech_style[i].float().cpu(),
                    video_content=content.video[i, content.video_mask[i]].float().cpu(),
                    video_style=style.video_style[i].float().cpu(),
                    dialogue_id=dialogue.id,
                    generated_text=text,
                    dropped_turns=prompts[i].first_turn,
                    emotion_source=emotion_source or EmpatheticResponse.emotion_source,
                )
            )
        return responses

    # ================================================================== saving
    def trained_state_dict(self) -> Dict[str, torch.Tensor]:
        """Only what training changes: the LoRA adapter with the signal-token rows (under
        ``language_model.``, named as peft names them), the projectors and both heads. Base
        models are referenced by the config."""
        state = {_LM_PREFIX + k: v for k, v in adapter_state_dict(self.language_model).items()}
        for name in _TRAINED_MODULES:
            state.update({f"{name}.{k}": v for k, v in getattr(self, name).state_dict().items()})
        return state

    def load_trained_state_dict(self, state: Dict[str, torch.Tensor], source: str = "state dict") -> None:
        """Load what :meth:`trained_state_dict` returns; any missing or unexpected key is an
        error naming it."""
        self.unmerge_adapter()
        lm_state = {k[len(_LM_PREFIX) :]: v for k, v in state.items() if k.startswith(_LM_PREFIX)}
        expected_lm = set(adapter_state_dict(self.language_model))
        problems = []
        if set(lm_state) != expected_lm:
            problems.append(
                f"language model adapter: missing {sorted(expected_lm - set(lm_state))[:5]}, "
                f"unexpected {sorted(set(lm_state) - expected_lm)[:5]}"
            )
        else:
            set_peft_model_state_dict(self.language_model, lm_state)
        for name in _TRAINED_MODULES:
            sub = {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")}
            result = getattr(self, name).load_state_dict(sub, strict=False)
            # Weights saved before the signal standardisers existed lack their statistics;
            # left at zero updates, the standardisers pass the states through as those
            # weights were trained.
            missing = [k for k in result.missing_keys if not k.endswith(_STANDARDIZER_BUFFERS)]
            if missing or result.unexpected_keys:
                problems.append(f"{name}: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")
        known = (_LM_PREFIX,) + tuple(n + "." for n in _TRAINED_MODULES)
        stray = [k for k in state if not k.startswith(known)]
        if stray:
            problems.append(f"keys of no known part: {stray[:5]}")
        if problems:
            raise ValueError(f"{source} does not match this model: " + "; ".join(problems))

    def save_pretrained(self, directory: Union[str, Path]) -> Path:
        """Write the trained parts only (about 55 MB for the small preset; the base models
        are referenced by the config)::

            config.yaml                 the model's config, plain YAML
            tokenizer/                  the tokenizer with the placeholder and signal tokens
            adapter_config.json         the LoRA adapter and the signal tokens' rows as a
            adapter_model.safetensors   PEFT adapter: PeftModel.from_pretrained(base, directory)
            empatheia.safetensors       projectors, Content Synchronizer, Style Disentangler

        The adapter loads with plain ``peft`` onto the base language model once its
        embeddings are resized to the tokenizer (docs/model.md, Files)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save_yaml(directory / CONFIG_NAME)
        self.tokenizer.save_pretrained(str(directory / TOKENIZER_DIR))
        state = {k: v.detach().contiguous().cpu() for k, v in self.trained_state_dict().items()}
        adapter = {k[len(_LM_PREFIX) :]: v for k, v in state.items() if k.startswith(_LM_PREFIX)}
        save_adapter(self.language_model, adapter, directory, self.config.language_model)
        parts = {k: v for k, v in state.items() if not k.startswith(_LM_PREFIX)}
        save_file(parts, str(directory / WEIGHTS_NAME), metadata={"format": "empatheia", "version": WEIGHTS_VERSION})
        return directory

    @staticmethod
    def read_trained_state(path: Union[str, Path]) -> Dict[str, torch.Tensor]:
        """The trained parts saved at ``path`` (:func:`load_trained_state`), for
        :meth:`load_trained_state_dict`; what the training loop resumes from."""
        return load_trained_state(path)

    @classmethod
    def from_pretrained(
        cls,
        directory: Union[str, Path],
        overrides: Optional[Dict[str, object]] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> "Empatheia":
        """Load a model saved by :meth:`save_pretrained` (in this layout or the earlier one,
        which kept the adapter inside ``empatheia.safetensors``). ``overrides`` can point
        base models to local paths, e.g. ``{"language_model.pretrained": "/models/vicuna"}``."""
        directory = Path(directory)
        for needed in (CONFIG_NAME, WEIGHTS_NAME):
            if not (directory / needed).is_file():
                raise FileNotFoundError(f"{directory} is not a saved Empatheia model: {needed} is missing")
        saved = read_yaml_mapping(directory / CONFIG_NAME)
        config = EmpatheiaConfig.from_dict(saved, source=str(directory / CONFIG_NAME))
        for section, option, before, _ in ADDED_OPTIONS:
            if option not in (saved.get(section) or {}):
                setattr(getattr(config, section), option, before)
        if overrides:
            config.update(overrides)
        tokenizer_dir = directory / TOKENIZER_DIR
        model = cls(config, tokenizer_path=tokenizer_dir if tokenizer_dir.is_dir() else None, dtype=dtype)
        if (directory / ADAPTER_CONFIG_NAME).is_file():
            check_adapter_config(model.language_model, directory)
        model.load_trained_state_dict(load_trained_state(directory), source=str(directory))
        return model.eval()


SPEAKER_EVENT_WORDS = 64
"""The most of the speaker's first turn :meth:`Empatheia.speaker_emotion_reading` puts in
the event step."""


def _last_speaker_text(dialogue: Dialogue) -> str:
    """The speaker's last words ("" without any): what the goal's lead reads, as the
    targets' rules read the last speaker turn with text."""
    index = last_speaker_index(dialogue, "text")
    return dialogue.turns[index].text if index is not None else ""


def load_trained_state(path: Union[str, Path]) -> Dict[str, torch.Tensor]:
    """The trained parts saved at ``path`` as one state dict keyed as
    :meth:`Empatheia.trained_state_dict` is. ``path`` is a folder written by
    :meth:`Empatheia.save_pretrained` (a run's ``final/``, a checkpoint's ``model/``) or its
    ``empatheia.safetensors``; the PEFT adapter beside it comes in under
    ``language_model.``. A file written before the adapter was saved on its own (version 1,
    like the shipped ``small`` weights) holds every part itself."""
    path = Path(path)
    folder, weights = (path.parent, path) if path.is_file() else (path, path / WEIGHTS_NAME)
    if not weights.is_file():
        raise FileNotFoundError(f"{path} holds no trained Empatheia weights: {weights.name} is missing")
    with safe_open(str(weights), framework="pt") as handle:
        version = (handle.metadata() or {}).get("version", "1")
    state = load_file(str(weights))
    has_adapter = (folder / ADAPTER_CONFIG_NAME).is_file()
    if version == "1" and not has_adapter:
        return state
    if not has_adapter:
        raise FileNotFoundError(f"{weights} holds no language-model adapter and {folder / ADAPTER_CONFIG_NAME} is missing")
    inside = [k for k in state if k.startswith(_LM_PREFIX)]
    if inside:
        raise ValueError(f"{weights} holds language-model tensors ({inside[:2]}) beside the adapter in {folder}; keep one")
    state.update({_LM_PREFIX + k: v for k, v in load_adapter_weights(folder).items()})
    return state


# ---------------------------------------------------------------------- helpers


class _FirstLogits(LogitsProcessor):
    """Keeps the logits ``(B, V)`` of the first ``steps`` generated steps and changes none."""

    def __init__(self, steps: int):
        self.steps, self.kept = steps, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if len(self.kept) < self.steps:
            self.kept.append(scores.detach().clone())
        return scores


class ContextFreeScorer:
    """The language model's next-token log-probabilities after a fixed ``context`` (a
    prompt without a dialogue, then the reply's lead-in) and a few reply tokens, for
    :class:`~empatheia.logits_processors.GenericReplyPenalty`. The context is encoded once,
    on the first call, and its cache copied for each later one, so a call costs only the
    reply tokens it is given.

    ``running`` is True during a call: the hidden states that
    :meth:`Empatheia.generate_text` records for the generation's cache must not take in
    this side pass's."""

    def __init__(self, language_model: nn.Module, context: torch.Tensor):
        self.language_model = language_model
        self.context = context  # (C,)
        self.running = False
        self._encoded = None  # (cache of the context, log-probabilities after it (V,))

    def __call__(self, replies: torch.Tensor, counts: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(n, V)`` from the reply tokens so far ``replies`` ``(n, w)`` (right-padded; row
        ``i`` holds ``counts[i]`` tokens, 0 or more); ``rows`` (their batch rows) does not
        matter here, every row having the same context."""
        self.running = True
        try:
            if self._encoded is None:
                out = self.language_model(input_ids=self.context[None].to(replies.device), use_cache=True)
                self._encoded = (out.past_key_values, torch.log_softmax(out.logits[0, -1].float(), dim=-1))
            cache, after_context = self._encoded
            result = after_context.expand(len(counts), -1).clone()
            rows = (counts > 0).nonzero().squeeze(1)
            if rows.numel():
                width = int(counts[rows].max())
                past = copy.deepcopy(cache)
                past.batch_repeat_interleave(len(rows))
                reply_mask = (torch.arange(width, device=replies.device)[None, :] < counts[rows, None]).long()
                mask = torch.cat([reply_mask.new_ones(len(rows), self.context.numel()), reply_mask], dim=1)
                logits = self.language_model(input_ids=replies[rows, :width], attention_mask=mask,
                                             past_key_values=past, use_cache=True).logits  # (r, width, V)
                last = logits[torch.arange(len(rows), device=logits.device), counts[rows] - 1]
                result[rows] = torch.log_softmax(last.float(), dim=-1)
            return result
        finally:
            self.running = False


class ListenerTurnScorer:
    """The language model's next-token log-probabilities after each batch row's own
    context, then a few reply tokens, for
    :class:`~empatheia.logits_processors.GenericReplyPenalty`: row ``b``'s context is the
    prompt whose dialogue holds only the listener's turns its prompt kept, then the reply's
    lead-in (``contexts[b]``, 1-D token ids). The contexts are encoded once, left-padded,
    on the first call; each later call runs only the reply tokens it is given on a copy of
    their rows' cache. Left padding shifts a row's positions by a constant, which rotary
    position embeddings do not see.

    Why: the penalty on generic openings prefers what is likely given the dialogue and
    unlikely given none, and the listener's own earlier words are exactly that, so it
    rewards repeating them. Measured against the listener's turns instead, a reply gains
    nothing by repeating them.

    ``running`` is True during a call, as for :class:`ContextFreeScorer`."""

    def __init__(self, language_model: nn.Module, contexts: Sequence[torch.Tensor], pad_id: int):
        self.language_model = language_model
        self.contexts = list(contexts)
        self.pad_id = pad_id
        self.running = False
        self._encoded = None  # (cache of the contexts, their mask (B, C), log-probabilities after them (B, V))

    def __call__(self, replies: torch.Tensor, counts: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(n, V)`` from the reply tokens so far ``replies`` ``(n, w)`` (right-padded; row
        ``i`` holds ``counts[i]`` tokens, 0 or more) of the batch rows ``rows`` ``(n,)``
        (default: rows 0 to n - 1)."""
        device = replies.device
        rows = torch.arange(len(counts), device=device) if rows is None else rows.to(device)
        self.running = True
        try:
            if self._encoded is None:
                width = max(int(c.numel()) for c in self.contexts)
                ids = torch.full((len(self.contexts), width), self.pad_id, dtype=torch.long, device=device)
                mask = torch.zeros_like(ids)
                for b, context in enumerate(self.contexts):
                    ids[b, width - context.numel():] = context.to(device)
                    mask[b, width - context.numel():] = 1
                out = self.language_model(input_ids=ids, attention_mask=mask, use_cache=True)
                self._encoded = (out.past_key_values, mask, torch.log_softmax(out.logits[:, -1].float(), dim=-1))
            cache, mask, after_context = self._encoded
            result = after_context[rows].clone()
            going = (counts > 0).nonzero().squeeze(1)
            if going.numel():
                width = int(counts[going].max())
                past = copy.deepcopy(cache)
                past.batch_select_indices(rows[going])
                reply_mask = (torch.arange(width, device=device)[None, :] < counts[going, None]).long()
                logits = self.language_model(input_ids=replies[going, :width],
                                             attention_mask=torch.cat([mask[rows[going]], reply_mask], dim=1),
                                             past_key_values=past, use_cache=True).logits  # (r, width, V)
                last = logits[torch.arange(len(going), device=device), counts[going] - 1]
                result[going] = torch.log_softmax(last.float(), dim=-1)
            return result
        finally:
            self.running = False


class _StepCounter(LogitsProcessor):
    """Calls ``progress`` with the number of steps generated so far; changes no logit."""

    def __init__(self, progress: Callable[[int], None]):
        self.progress, self.steps = progress, 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        self.progress(self.steps)
        return scores


def _embedding_norm(language_model) -> Optional[float]:
    """The mean length of the language model's input token embeddings (``None`` for
    weights on the meta device, which have no values)."""
    weight = language_model.get_input_embeddings().weight
    if weight.is_meta:
        return None
    with torch.no_grad():
        return float(weight.float().norm(dim=-1).mean())


def _right_padded(mask: torch.Tensor) -> bool:
    """Whether every row is ones then zeros (padding only at the end)."""
    return bool((mask.cumprod(-1) == mask).all())


def _squared_distance(pred: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor], name: str) -> torch.Tensor:
    """Eqs. 9-10's squared Euclidean distance ``||pred - target||^2``, summed over the
    feature dimensions and averaged over the valid rows: ``pred`` ``(B, L, D)`` with
    ``mask`` ``(B, L)`` (content, one distance per unit) or ``(B, D)`` (style, one per
    item) with an optional ``mask`` ``(B,)``. With no valid row the result is 0 and still
    part of the graph."""
    target = target.to(pred.device, pred.dtype)
    if pred.shape[-1] != target.shape[-1] or (pred.dim() == 2 and pred.shape != target.shape):
        raise ValueError(f"{name}: prediction has shape {tuple(pred.shape)} but the target has {tuple(target.shape)}")
    if pred.dim() == 2:
        distance = ((pred - target) ** 2).sum(-1)  # (B,)
        if mask is None:
            return distance.mean()
        mask = mask.to(pred.device, pred.dtype)
        return (distance * mask).sum() / mask.sum().clamp(min=1)
    mask = mask[:, : pred.shape[1]].to(pred.dtype)
    target = target[:, : pred.shape[1]]
    return (((pred - target) ** 2).sum(-1) * mask).sum() / mask.sum().clamp(min=1)


def _check_profile_labels(batch: Dict[str, torch.Tensor], classifiers: Dict[str, torch.Tensor]) -> None:
    """A batch labelling a profile attribute that no classifier predicts was built with other
    label sets than the model's: say so rather than train on without those labels."""
    labelled = [key[: -len("_label")] for key in batch if key.endswith("_label") and key != "emotion_label"]
    unknown = [name for name in labelled if name not in classifiers]
    if unknown:
        raise ConfigError(
            f"the batch has labels of profile attribute(s) {unknown}, which the Style Disentangler does not classify "
            f"(it classifies {sorted(classifiers)}): give the model the data's label sets first with "
            "model.set_label_sets(labels), as the training recipe does when data.labels is set"
        )


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    labels = labels.to(logits.device).long()
    if not bool((labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # no labelled item: a zero that keeps the graph
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)


def _predictions(logits: torch.Tensor, labels: Sequence[str]) -> List[LabelPrediction]:
    probs = logits.float().softmax(-1).cpu()
    return [
        LabelPrediction(label=labels[int(row.argmax())], probabilities={l: round(float(p), 6) for l, p in zip(labels, row)})
        for row in probs
    ]


def chain_emotion_token_ids(tokenizer, labels: Sequence[str]) -> torch.Tensor:
    """``(K,)`` the first token of each label as the chain writes it (after ``": "``); a
    ``ValueError`` names labels that share a first token, which could not be told apart."""
    firsts = [tokenizer.encode(f" {label}", add_special_tokens=False)[0] for label in labels]
    shared: Dict[int, List[str]] = {}
    for label, token in zip(labels, firsts):
        shared.setdefault(token, []).append(label)
    clashes = [names for names in shared.values() if len(names) > 1]
    if clashes:
        raise ValueError(
            f"language_model.chain_emotions: {clashes} share a first token in this tokenizer, so their "
            "probabilities cannot be told apart; rename or drop them (or set chain_emotions to None)"
        )
    return torch.tensor(firsts, dtype=torch.long)


def _to(batch: Dict[str, torch.Tensor], device: torch.device) -> Dict[str, torch.Tensor]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
