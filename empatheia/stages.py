"""The four training stages of §5, each one object.

A :class:`Stage` says what the stage trains (groups of
:meth:`~empatheia.modeling.Empatheia.parameter_groups`), the prompt layout of its examples
(Appendix D.1), which of the paper's objectives it computes (and so the batch keys and gold
generator features it needs) and how its loss is composed from weighted terms (eq. 13 and
the VAEs' KL). The model (``set_stage``, ``forward``), the data pipeline (``StageDataset``,
``build_stage_data``) and the training recipe read these objects; nothing else decides what
a stage is.

=====  ==================  =====================================  =========  ==============================
stage  name                trains                                 layout     loss
=====  ==================  =====================================  =========  ==============================
1      ``stage1_coe``      LoRA, signal rows                      text       L_emp (eq. 8)
2      ``stage2_ccl``      Content Synchronizer                   text       L_ccl (eq. 9) + KL
3      ``stage3_sac``      projectors, Style Disentangler         style      L_sal + L_cls (eqs. 10-12) + KL
4      ``stage4_joint``    all of the above                       full       L_emp + α L_ccl + β L_sac + KL
=====  ==================  =====================================  =========  ==============================

The field's other systems add their own (:data:`VARIANT_STAGES`, by name): the pipeline
baseline's ``pipeline_text`` trains the LoRA on the meta-response layout (``pipeline``),
with L_emp alone; MERIA's three (``meria_pdr``, ``meria_mcoe``, ``meria_response``) and
early fusion's two (``early_fusion_joint``, ``early_fusion_text``) train models of their
own (:attr:`Stage.system`).

This module sits below the model, the processor and the data pipeline: it imports only the
prompt layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

from .prompts import PromptMode

PARAMETER_GROUPS = ("lora", "signal_rows", "projectors", "content_synchronizer", "style_disentangler")
"""The groups a stage can train; every other parameter (encoders, base language model) is
``frozen``."""

CONTENT_FEATURES = ("speech_content", "video_content")
"""Gold content features of the response (C^s, C^v), one row per speech unit."""
STYLE_FEATURES = ("speech_style", "video_style")
"""Gold style features of the response's speech and video (S^s, S^v)."""

_PROMPT_KEYS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class Objective:
    """One of the paper's losses, with what it reads."""

    name: str
    """``emp``, ``ccl`` or ``sac`` (L_emp, L_ccl, L_sac)."""
    equations: str
    batch_keys: Tuple[str, ...]
    """Batch keys it reads beyond the prompt's ``input_ids`` and ``attention_mask``."""
    gold_features: Tuple[str, ...] = ()
    """Generator features of the gold response it regresses onto."""
    reads_response: bool = False
    """Whether it needs the gold response's text (the target of L_emp, the tokens the
    Content Synchronizer reads)."""
    class_labels: bool = False
    """Whether it needs the emotion and profile class labels (eq. 11)."""


EMP = Objective("emp", "eq. 8", ("labels",), reads_response=True)
CCL = Objective(
    "ccl",
    "eq. 9",
    ("response_mask", "speech_content_target", "speech_content_mask", "video_content_target", "video_content_mask"),
    gold_features=CONTENT_FEATURES,
    reads_response=True,
)
SAC = Objective(
    "sac",
    "eqs. 10-12",
    ("speech_style_target", "video_style_target", "emotion_label"),
    gold_features=STYLE_FEATURES,
    class_labels=True,
)


PDR = Objective("pdr", "MERIA eq. 1", ())
"""MERIA's disentanglement loss over the user's utterance features (its batch keys are the
variant's own, :mod:`empatheia.variants.prefix`)."""
JOINT = Objective("joint", "InfoNCE (ImageBind)", ())
"""Early fusion's contrastive loss binding the modalities' embeddings."""


@dataclass(frozen=True)
class Term:
    """One summand of a stage's loss: the model's ``losses`` added up, times the
    :class:`~empatheia.config.LossConfig` field ``weight`` (1 when ``None``)."""

    name: str
    """Logged as ``weighted_<name>`` by stages that combine objectives."""
    losses: Tuple[str, ...]
    weight: Optional[str] = None
    optional: bool = False
    """Left out when its weight is 0: an addition to the paper's loss that a preset
    switches on (the model then does not compute it at all)."""


# Added to L_emp where a preset asks for them (LossConfig.chain_emotion_weight and
# chain_goal_weight; docs/model.md).
_CHAIN_EMOTION = Term("chain_emotion", ("loss_chain_emotion",), "chain_emotion_weight", optional=True)
_CHAIN_GOAL = Term("chain_goal", ("loss_chain_goal",), "chain_goal_weight", optional=True)
# Stage 1 only (LossConfig.listener_echo_weight): its examples carry, beside the target,
# the listener's last turn written as the reply (StageDataset).
_LISTENER_ECHO = Term("listener_echo", ("loss_listener_echo",), "listener_echo_weight", optional=True)


@dataclass(frozen=True)
class Stage:
    """One training stage: what trains, on which examples, against which loss."""

    number: int
    name: str
    """The stage's config (``configs/train/<name>.yaml``) and default output folder."""
    title: str
    trains: Tuple[str, ...]
    """The parameter groups it makes trainable (:data:`PARAMETER_GROUPS`)."""
    layout: PromptMode
    """The prompt layout of its examples (Appendix D.1)."""
    objectives: Tuple[Objective, ...]
    terms: Tuple[Term, ...]
    """The summands of its loss, in the order they are added."""
    system: str = "empatheia"
    """The system whose model trains in it: ``empatheia`` (and the pipeline baseline, whose
    model is Empatheia's) or a variant with a model of its own (``meria``,
    ``early_fusion``; :mod:`empatheia.variants.prefix`)."""

    def computes(self, objective: Objective) -> bool:
        return objective in self.objectives

    def has_term(self, name: str) -> bool:
        """Whether one of its :attr:`terms` is called ``name`` (an optional one may still
        be weighted 0)."""
        return any(term.name == name for term in self.terms)

    @property
    def batch_keys(self) -> Tuple[str, ...]:
        """Keys ``Empatheia.forward`` needs in a batch of this stage (profile labels and,
        with a unit vocabulary, ``speech_units`` come on top, as the config says)."""
        keys = _PROMPT_KEYS + tuple(key for objective in self.objectives for key in objective.batch_keys)
        return tuple(dict.fromkeys(keys))

    @property
    def gold_features(self) -> Tuple[str, ...]:
        return tuple(name for objective in self.objectives for name in objective.gold_features)

    @property
    def reads_response(self) -> bool:
        return any(objective.reads_response for objective in self.objectives)

    @property
    def class_labels(self) -> bool:
        return any(objective.class_labels for objective in self.objectives)

    @property
    def reads_media(self) -> bool:
        """Whether its prompts carry the turns' speech and video (every example needs some)."""
        return self.layout.reads_media

    @property
    def mixes_text_and_media(self) -> bool:
        """Whether its layout has the turns' text beside their media, so that an example
        may also be shown as text alone (``text_only_share``, ``text_dialogues``)."""
        return self.layout is PromptMode.FULL

    @property
    def builds_language_model_graph(self) -> bool:
        """Whether its gradient passes through the language model: it trains parts inside
        it (LoRA, signal rows) or before it (the projectors). Otherwise the model's states
        are read without a graph, which spares its activation memory."""
        return bool({"lora", "signal_rows", "projectors"} & set(self.trains))

    @property
    def logs_weighted_terms(self) -> bool:
        """Whether each weighted term is logged (``weighted_*``): where objectives are
        combined with weights (eq. 13), so a term too small to train is seen."""
        return len(self.objectives) > 1

    @property
    def starts_from_preset(self) -> bool:
        """A first stage (1, or a variant's only stage) starts from the preset's pretrained
        parts; every later stage from a trained model (the previous stage's output). (A
        variant with ablations decides for itself: MERIA without its PDR starts its M-CoE
        stage from the preset.)"""
        return self.number == 1


STAGES: Dict[int, Stage] = {
    stage.number: stage
    for stage in (
        Stage(1, "stage1_coe", "Chain-of-Empathy learning (§5.1)", ("lora", "signal_rows"), PromptMode.TEXT, (EMP,),
              (Term("emp", ("loss_emp",)), _CHAIN_EMOTION, _CHAIN_GOAL, _LISTENER_ECHO)),
        Stage(2, "stage2_ccl", "content consistency learning (§5.2)", ("content_synchronizer",), PromptMode.TEXT, (CCL,),
              (Term("ccl", ("loss_ccl",)), Term("kl", ("kl_content",), "kl_weight"))),
        # The projectors train from stage 3, the first whose prompts carry speech and video;
        # the language model stays frozen and passes their gradient through.
        Stage(3, "stage3_sac", "style alignment and consistency learning (§5.3)", ("projectors", "style_disentangler"),
              PromptMode.STYLE, (SAC,),
              (Term("sal", ("loss_sal",)), Term("cls", ("loss_cls",)), Term("kl", ("kl_style",), "kl_weight"))),
        # Eq. 13 with L_sac = L_sal + L_cls split so each is logged; β weighs both.
        Stage(4, "stage4_joint", "joint MERG tuning (§5.4)", PARAMETER_GROUPS, PromptMode.FULL, (EMP, CCL, SAC),
              (Term("emp", ("loss_emp",)), Term("ccl", ("loss_ccl",), "alpha"), Term("sal", ("loss_sal",), "beta"),
               Term("cls", ("loss_cls",), "beta"), Term("kl", ("kl_content", "kl_style"), "kl_weight"), _CHAIN_EMOTION, _CHAIN_GOAL)),
    )
}


VARIANT_STAGES: Dict[str, Stage] = {
    stage.name: stage
    for stage in (
        # The pipeline baseline (Appendix E.2): the same language core learns, from text,
        # to write the speaker's emotion and the listener's profile explicitly, then the
        # reply; no chain, no signal tokens, no heads. It is the pipeline's only stage. A
        # preset's emotion term (at the written emotion) applies as in stage 1, so the two
        # systems differ in what they are, not in how the emotion token is weighted.
        Stage(1, "pipeline_text", "pipeline baseline text tuning (Appendix E.2)", ("lora",), PromptMode.PIPELINE, (EMP,),
              (Term("emp", ("loss_emp",)), _CHAIN_EMOTION, _CHAIN_GOAL)),
        # MERIA (MM'25, shared/papers/000): the PDR's eight beta-VAE encoders alone on the
        # user's utterance features (eq. 1), then the M-CoE LLM (LoRA and the soft-prompt
        # MLPs) writing the multimodal chain, then the Response LLM (a second LoRA) writing
        # the emotion and reply from that chain.
        Stage(1, "meria_pdr", "MERIA parallel disentangled representation (eq. 1)", ("pdr",), PromptMode.MCOE,
              (PDR,), (Term("pdr", ("loss_pdr",)),), system="meria"),
        Stage(2, "meria_mcoe", "MERIA M-CoE LLM with soft prompts (§3.3)", ("lora", "soft_prompts"), PromptMode.MCOE,
              (EMP,), (Term("emp", ("loss_emp",)),), system="meria"),
        Stage(3, "meria_response", "MERIA Response LLM (§3.3)", ("response_lora",), PromptMode.PIPELINE,
              (EMP,), (Term("emp", ("loss_emp",)),), system="meria"),
        # Early fusion (shared/papers/003): a joint embedding of the user's text, speech and
        # face, learnt contrastively as ImageBind's is, then LoRA and the projector that
        # prepends it to the prompt.
        Stage(1, "early_fusion_joint", "early fusion joint embedding (contrastive)", ("joint_embedding",),
              PromptMode.PIPELINE, (JOINT,), (Term("joint", ("loss_joint",)),), system="early_fusion"),
        Stage(2, "early_fusion_text", "early fusion LoRA with the prepended joint embedding", ("lora", "soft_prompts"),
              PromptMode.PIPELINE, (EMP,), (Term("emp", ("loss_emp",)),), system="early_fusion"),
    )
}
"""Stages of the field's other systems (docs/variants.md), by name."""


def get_stage(number: Union[int, str, Stage]) -> Stage:
    """The stage numbered ``number`` of the curriculum, or a variant's stage by name (a
    :class:`Stage` is returned as it is); a ``ValueError`` names the valid ones otherwise."""
    if isinstance(number, Stage):
        return number
    try:
        return VARIANT_STAGES[number] if isinstance(number, str) else STAGES[number]
    except (KeyError, TypeError):
        raise ValueError(f"stage must be one of {list(STAGES) + list(VARIANT_STAGES)}, got {number!r}") from None
