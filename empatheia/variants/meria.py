"""MERIA (Dang and Zhu, MM'25; ``shared/papers/000``) over our parts.

==========================  =================================  ==========================================
paper                       here                               trained in stage
==========================  =================================  ==========================================
PDR, eight beta-VAE         :class:`~.disentangle.             ``meria_pdr`` (eq. 1, every term)
encoders, decoders,         ParallelDisentangler` on the
identity classifiers        user's text, speech and face
                            features (:mod:`.prefix`)
UGF (eqs. 6-8)              :func:`~.fusion.                   (no parameters)
                            uncertainty_gated_fusion`
soft prompts                one :class:`~.prefix.SoftPrompt`   ``meria_mcoe``, with the LoRA
                            per representation: Z_S^F with
                            the conflict, Z_I^F, (Z_P^A, Z_P^V)
M-CoE LLM                   the language core, adapter         ``meria_mcoe``: writes the multimodal chain
                            ``default``                        (:mod:`.mcoe`)
Response LLM                the same base, adapter             ``meria_response``: the emotion and the
                            ``response``                       reply from the dialogue and the chain
==========================  =================================  ==========================================

Both LLMs are LoRA adapters on one frozen base (the paper tunes two copies of Qwen3-32B
with LoRA; the frozen base being the same, one copy with two adapters computes the same).

The paper's ablations are options (:class:`MeriaOptions`): ``use_pdr: false`` feeds the
utterance features straight to one soft prompt per modality (no disentanglement, so no
fusion either); ``use_ugf: false`` averages the shared emotions with equal weights;
``use_mcoe: false`` drops the M-CoE LLM, and the Response LLM reads the soft prompts
itself (the paper does not say where the signals go without it; they must go somewhere
for the row to differ from a text-only model).

Like the pipeline baseline, the written emotion picks the voice's and the face's styles
from a table measured on the generators: MERIA is a text-response system, and no feature
of it reaches the generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from peft import LoraConfig
from torch import nn

from ..decoding import Decoding
from ..dialogue import Dialogue
from ..prompts import ChainOfEmpathy, PromptMode
from ..stages import Stage, get_stage
from . import MODALITIES
from .disentangle import ParallelDisentangler, PDRConfig, pdr_loss
from .fusion import uncertainty_gated_fusion
from .mcoe import MultimodalChain, parse_mcoe
from .pipeline import EMOTION_STEP_LIMIT, PipelineSystem
from .prefix import PrefixModel, SoftPrompt, chain_notes, word_length
from .styles import StyleTable

RESPONSE_ADAPTER = "response"
"""The Response LLM's LoRA adapter; the M-CoE LLM's is the core's ``default``."""


@dataclass
class MeriaOptions(PDRConfig):
    """MERIA's own options (``model.variant`` in a training config; ``variant.yaml`` of a
    saved model): the PDR's sizes and eq. 1's weights (:class:`PDRConfig`, whose
    ``latent_dim`` is each beta-VAE latent's width), then these."""

    soft_prompt_tokens: int = 4
    """Virtual tokens per representation (three representations, so 12 in all; with
    ``use_pdr: false``, one per modality)."""
    soft_prompt_hidden: int = 512
    response_lora_r: int = 16
    """The Response LLM's LoRA (the paper: r 16, alpha 32 for both LLMs)."""
    response_lora_alpha: int = 32
    chain_tokens: int = 128
    """At most this many tokens of multimodal chain are written at inference."""
    use_pdr: bool = True
    use_ugf: bool = True
    use_mcoe: bool = True


class MeriaModel(PrefixModel):
    """MERIA's trained parts over ``core`` (an :class:`~empatheia.modeling.Empatheia`):
    the PDR (unless ``use_pdr`` is off), the soft prompts and the Response LLM's adapter."""

    system = "meria"
    options_class = MeriaOptions
    groups = ("pdr", "soft_prompts", "lora", "response_lora")
    fresh_groups = ("pdr", "soft_prompts")
    # One meria_pdr run serves the full model and the UGF and M-CoE ablations.
    late_options = ("use_ugf", "use_mcoe", "chain_tokens")

    def __init__(self, core, options: Optional[MeriaOptions] = None):
        super().__init__(core, options or MeriaOptions())
        options = self.options
        config = core.config
        width = config.language_model.hidden_size
        self.input_dims = {"text": width, "audio": core.speech_encoder.hidden_size, "video": core.video_encoder.hidden_size}
        # The speaker's profile attributes are what MERIA's identity classifiers predict
        # (AvaMERG annotates age and gender; ED-rendered data names its speakers' too).
        self.identity_labels = {k: list(v) for k, v in core.label_sets().profile.items()}
        cap = word_length(core)
        tokens, hidden = options.soft_prompt_tokens, options.soft_prompt_hidden
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed + 7)
            if options.use_pdr:
                self.pdr = ParallelDisentangler(self.input_dims, options, self.identity_labels,
                                                len(core.label_sets().emotions))
                z = options.latent_dim
                # Z_S^F with UGF's conflict signal; Z_I^F = (Z_I^A, Z_I^V); (Z_P^A, Z_P^V).
                inputs = {"emotion": z + 1, "identity": 2 * z, "private": 2 * z}
            else:
                self.pdr = None
                inputs = dict(self.input_dims)
            self.soft_prompts = nn.ModuleDict(
                {name: SoftPrompt(dim, width, tokens, hidden, cap) for name, dim in inputs.items()})
            lora = config.language_model.lora
            core.language_model.add_adapter(RESPONSE_ADAPTER, LoraConfig(
                r=options.response_lora_r, lora_alpha=options.response_lora_alpha, lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules), task_type="CAUSAL_LM"))
        core.language_model.set_adapter("default")

    # ------------------------------------------------------------- stages
    def group_of(self, name: str) -> str:
        if name.startswith("pdr."):
            return "pdr"
        if name.startswith("soft_prompts."):
            return "soft_prompts"
        if name.startswith("core.language_model.") and "lora_" in name:
            return "response_lora" if f".{RESPONSE_ADAPTER}." in name else "lora"
        return "frozen"

    def stage_groups(self, stage: Stage) -> Tuple[str, ...]:
        if stage.name == "meria_response" and not self.options.use_mcoe:
            # Without the M-CoE LLM the Response LLM reads the soft prompts, which learn here.
            return stage.trains + ("soft_prompts",)
        return stage.trains

    @classmethod
    def needs_init(cls, stage: Stage, options: MeriaOptions) -> Optional[str]:
        if stage.name == "meria_mcoe" and options.use_pdr:
            return ("stage meria_mcoe reads the trained PDR: start it from meria_pdr's output "
                    "(or ablate the PDR with model.variant.use_pdr: false)")
        if stage.name == "meria_response" and (options.use_pdr or options.use_mcoe):
            before = "meria_mcoe" if options.use_mcoe else "meria_pdr"
            return f"stage meria_response reads what {before} trained: start it from {before}'s output"
        return None

    def reads_chains(self, stage: Stage) -> Tuple[bool, bool]:
        if stage.name == "meria_mcoe":
            return True, False
        if stage.name == "meria_response" and self.options.use_mcoe:
            return True, True
        return False, False

    def set_stage(self, stage) -> "MeriaModel":
        stage = get_stage(stage)
        if stage.name == "meria_pdr" and self.pdr is None:
            raise ValueError("model.variant.use_pdr is false: this MERIA has no PDR to train (skip stage meria_pdr)")
        if stage.name == "meria_mcoe" and not self.options.use_mcoe:
            raise ValueError("model.variant.use_mcoe is false: this MERIA has no M-CoE LLM to train "
                             "(go from meria_pdr to meria_response)")
        self.core.language_model.set_adapter(RESPONSE_ADAPTER if stage.name == "meria_response" else "default")
        return super().set_stage(stage)

    def train(self, mode: bool = True) -> "MeriaModel":
        super().train(mode)
        # A frozen PDR reads its means, not samples: the prompts it makes stay put.
        if self.pdr is not None and (self.stage is None or "pdr" not in self.stage_groups(self.stage)):
            self.pdr.eval()
        return self

    # ------------------------------------------------------------- computing
    def representations(self, batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        """What the soft prompts read, each ``(B, D)``: with the PDR, ``emotion`` (Z_S^F
        and the conflict), ``identity`` and ``private``; without it, each modality's
        utterance feature (zeros where a row lacks it)."""
        features, present = self.utterance_features(batch)
        size = batch["input_ids"].shape[0]
        if self.pdr is None:
            device = self.device
            return {m: features[m] if m in features else torch.zeros(size, self.input_dims[m], device=device)
                    for m in MODALITIES}
        fusion = uncertainty_gated_fusion(self.pdr(features, present), gated=self.options.use_ugf)
        return {"emotion": torch.cat([fusion.fused, fusion.conflict.unsqueeze(-1)], dim=-1),
                "identity": fusion.identity, "private": fusion.private}

    def prefix(self, batch: Dict[str, Any]) -> torch.Tensor:
        """The soft prompts ``(B, k * R, H)`` for ``R`` representations."""
        reps = self.representations(batch)
        dtype = self.core.language_model.get_input_embeddings().weight.dtype
        return torch.cat([self.soft_prompts[name](reps[name].float()) for name in self.soft_prompts], dim=1).to(dtype)

    def forward(self, batch: Dict[str, Any], stage=None) -> Dict[str, torch.Tensor]:
        stage = get_stage(stage) if stage is not None else self.stage
        if stage is None:
            raise ValueError("set a stage first (model.set_stage('meria_pdr'))")
        if stage.name == "meria_pdr":
            features, present = self.utterance_features(batch)
            output = self.pdr(features, present)
            identity = {k: batch[f"{k}_label"] for k in self.identity_labels if f"{k}_label" in batch}
            terms = pdr_loss(output, features, self.pdr.config, identity, batch["identity"], batch.get("emotion_label"))
            return {"loss": terms["loss"], "loss_pdr": terms["loss"], **{k: v for k, v in terms.items() if k != "loss"}}
        reads_prefix = stage.name == "meria_mcoe" or not self.options.use_mcoe
        loss = self.prefixed_loss(self.prefix(batch) if reads_prefix else None, batch)
        return {"loss": loss, "loss_emp": loss}


    def write_chains(self, items: Sequence[Dialogue], prefix: Optional[torch.Tensor] = None,
                     decoding: Optional[Decoding] = None,
                     progress: Optional[Callable[[int], None]] = None) -> List[MultimodalChain]:
        """The M-CoE LLM's multimodal chain of each dialogue (``prefix``: their soft
        prompts, when already computed; ``decoding``: greedy by default, and the
        repetition control, which reaches replies only, leaves the chain alone;
        ``progress`` as for ``respond``)."""
        if prefix is None:
            prefix = self.prefix(self.inference_batch(items, PromptMode.MCOE))
        with self.adapter("default"):
            written = self.core.generate_text(items, PromptMode.MCOE, self.options.chain_tokens, decoding,
                                              reserve_signals=False, prefix=prefix, progress=progress)
        return [parse_mcoe(text) for text in written.texts]


@torch.no_grad()
def write_chains(meria: MeriaModel, dialogues: Sequence[Dialogue], batch_size: int = 8,
                 progress: bool = True) -> Dict[str, MultimodalChain]:
    """The chains a trained M-CoE LLM writes for ``dialogues``, by id: what the paper's
    Response LLM trains on (``empatheia variants mcoe --model``)."""
    from tqdm.auto import tqdm

    if not meria.options.use_mcoe:
        raise ValueError("this MERIA has no M-CoE LLM (use_mcoe is false)")
    meria.eval()
    chains: Dict[str, MultimodalChain] = {}
    for start in tqdm(range(0, len(dialogues), batch_size), desc="M-CoE", disable=not progress):
        items = list(dialogues[start : start + batch_size])
        chains.update(zip([d.id for d in items], meria.write_chains(items)))
    return chains


class MeriaSystem(PipelineSystem):
    """MERIA answering: the soft prompts of the user's utterance, the M-CoE LLM's chain, then
    the Response LLM's emotion and reply (the pipeline's meta-response, which picks the
    styles)."""

    name = "meria"
    title = "MERIA"

    def __init__(self, meria: MeriaModel, styles: StyleTable):
        super().__init__(meria.core, styles)
        self.meria = meria
        self.last_chains: List[Optional[MultimodalChain]] = []
        """The multimodal chain of each dialogue of the last call (``None`` without M-CoE)."""

    def _network(self) -> nn.Module:
        return self.meria

    def to(self, *args, **kwargs) -> "MeriaSystem":
        self.meria.to(*args, **kwargs)
        return self

    def write(self, items: Sequence[Dialogue], max_new_tokens, decoding, progress=None):
        meria, core = self.meria, self.model
        prefix = meria.prefix(meria.inference_batch(items, PromptMode.MCOE))
        if not meria.options.use_mcoe:
            self.last_chains = [None] * len(items)
            with meria.adapter(RESPONSE_ADAPTER):
                return core.generate_text(items, PromptMode.PIPELINE, max_new_tokens, decoding, reserve_signals=False,
                                          score_steps=EMOTION_STEP_LIMIT, prefix=prefix, progress=progress)
        self.last_chains = meria.write_chains(items, prefix, decoding, progress)
        with meria.adapter(RESPONSE_ADAPTER):
            return core.generate_text(items, PromptMode.PIPELINE, max_new_tokens, decoding, reserve_signals=False,
                                      score_steps=EMOTION_STEP_LIMIT, notes=[chain_notes(c) for c in self.last_chains],
                                      progress=progress)

    def answer(self, items, max_new_tokens, decoding, progress=None):
        written = self.write(items, max_new_tokens, decoding, progress)
        chains = preambles = None
        if self.meria.options.use_mcoe:
            chains = [c.chain or ChainOfEmpathy(raw=c.raw, parsed=False) for c in self.last_chains]
            preambles = [c.raw or "" for c in self.last_chains]
        responses = self.package(items, written, chains, preambles)
        for response in responses:
            response.emotion_source = "the emotion its Response LLM wrote"
        return responses
