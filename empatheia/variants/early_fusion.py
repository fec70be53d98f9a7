"""Early fusion (Gai, Daniels and Hae, 2025; ``shared/papers/003``) over our parts.

The paper embeds the user's audio and video with ImageBind, adds the two embeddings,
maps the sum into the language model's embedding space with a linear projector and
prepends it to the prompt; the language model (Mistral-7B, Llama-3-8B) is tuned with
4-bit QLoRA (r 8, alpha 16, dropout 0.1) while ImageBind stays frozen.

ImageBind is one embedding space that several encoders are bound into by a contrastive
(InfoNCE) loss on paired data, each encoder followed by a linear head. Two joint spaces can
be used (``joint_encoder``):

* ``imagebind``: ImageBind itself (:class:`~empatheia.encoders.imagebind.ImageBind`, its
  video, audio and text parts, frozen), from a user's ``imagebind_huge.pth``
  (``imagebind_checkpoint``), as the paper. Its weights are not among those that ship
  offline.
* ``ours`` (the default): :class:`JointEmbedding` binds our own encoders' features the same
  way: a linear head per modality onto a shared, unit-length space, trained with symmetric
  InfoNCE between every pair of modalities of the same utterance (stage
  ``early_fusion_joint``).

The fused embedding is the sum of the modalities a row has, as in the paper; which
modalities take part is an option (the paper's audio and video, or text, audio and video:
the default).

Stage ``early_fusion_text`` then trains the projector and LoRA with the joint embedding
frozen; ``language_model.load_in_4bit`` makes that QLoRA on a GPU. It writes the pipeline
baseline's meta-response (the emotion, then the reply), whose emotion picks the voice's
and face's styles from the generators' table, as the pipeline's does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..prompts import PromptMode
from ..stages import Stage, get_stage
from . import MODALITIES
from .pipeline import EMOTION_STEP_LIMIT, PipelineSystem
from .prefix import PrefixModel, SoftPrompt, rows_mean, word_length
from .styles import StyleTable


@dataclass
class EarlyFusionOptions:
    """Early fusion's options (``model.variant`` of a training config)."""

    joint_dim: int = 256
    """Width of the joint embedding space (ImageBind's is 1024)."""
    modalities: List[str] = field(default_factory=lambda: list(MODALITIES))
    """Which of the user's modalities are embedded and summed (the paper: audio, video)."""
    temperature: float = 0.07
    """InfoNCE's initial temperature (learnt, as CLIP's and ImageBind's)."""
    prefix_tokens: int = 4
    """Virtual tokens the projector makes of the fused embedding."""
    joint_encoder: str = "ours"
    """``ours`` (:class:`JointEmbedding` over our encoders, stage ``early_fusion_joint``) or
    ``imagebind`` (ImageBind's own joint space, frozen; no joint stage)."""
    imagebind_checkpoint: Optional[str] = None
    """``imagebind_huge.pth``, for ``joint_encoder: imagebind``."""
    imagebind_size: str = "huge"
    """``huge`` (the checkpoint's architecture) or ``tiny`` (the same classes at test sizes,
    random weights: for tests, never for answers)."""

    def __post_init__(self):
        unknown = sorted(set(self.modalities) - set(MODALITIES))
        if unknown or not self.modalities:
            raise ValueError(f"early fusion modalities must be some of {list(MODALITIES)}, got {self.modalities}")
        if self.joint_encoder not in ("ours", "imagebind"):
            raise ValueError(f"early fusion joint_encoder must be ours or imagebind, got {self.joint_encoder!r}")
        if self.imagebind_size not in ("huge", "tiny"):
            raise ValueError(f"early fusion imagebind_size must be huge or tiny, got {self.imagebind_size!r}")
        if self.joint_encoder == "imagebind" and self.imagebind_size == "huge" and not self.imagebind_checkpoint:
            raise ValueError("early fusion with joint_encoder imagebind needs imagebind_checkpoint "
                             "(imagebind_huge.pth from the ImageBind release)")


def info_nce(a: torch.Tensor, b: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE of paired unit vectors ``a``, ``b`` ``(N, d)``: row ``i`` of ``a``
    should pick row ``i`` of ``b`` among all ``N``, and the other way round."""
    logits = logit_scale * a @ b.T
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


class JointEmbedding(nn.Module):
    """A linear head per modality onto one unit-length space ``(B, joint_dim)``, bound by
    :func:`info_nce` between every pair of modalities."""

    def __init__(self, input_dims: Dict[str, int], options: EarlyFusionOptions):
        super().__init__()
        self.modalities = tuple(options.modalities)
        # LayerNorm first: the encoders' features differ in scale by orders of magnitude.
        self.heads = nn.ModuleDict({m: nn.Sequential(nn.LayerNorm(input_dims[m]), nn.Linear(input_dims[m], options.joint_dim))
                                    for m in self.modalities})
        # One element, not a 0-d tensor: DeepSpeed broadcasts parameters as bytes.
        self.logit_scale = nn.Parameter(torch.tensor([math.log(1.0 / options.temperature)]))

    def forward(self, features: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Each modality's embedding ``(B, joint_dim)``, unit length."""
        return {m: F.normalize(self.heads[m](features[m].float()), dim=-1) for m in self.modalities if m in features}

    def contrastive_loss(self, embeddings: Dict[str, torch.Tensor], present: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean :func:`info_nce` over the pairs of modalities, each over the rows that have
        both (a pair with fewer than two such rows has no negatives and is left out)."""
        scale = self.logit_scale.exp().clamp(max=100.0)
        losses = []
        names = [m for m in self.modalities if m in embeddings]
        for i, m in enumerate(names):
            for n in names[i + 1 :]:
                both = present[m] & present[n]
                if int(both.sum()) >= 2:
                    losses.append(info_nce(embeddings[m][both], embeddings[n][both], scale))
        if not losses:
            return self.logit_scale.sum() * 0.0
        return torch.stack(losses).mean()

    @staticmethod
    def fuse(embeddings: Dict[str, torch.Tensor], present: Dict[str, torch.Tensor]) -> torch.Tensor:
        """The sum of the modalities each row has ``(B, joint_dim)`` (the paper adds its
        audio and video embeddings)."""
        return sum(e * present[m].unsqueeze(-1).to(e.dtype) for m, e in embeddings.items())


class EarlyFusionModel(PrefixModel):
    """Early fusion's trained parts over ``core``: the joint embedding, the projector
    (prefix tokens) and the core's LoRA."""

    system = "early_fusion"
    options_class = EarlyFusionOptions
    groups = ("joint_embedding", "soft_prompts", "lora")
    fresh_groups = ("joint_embedding", "soft_prompts")

    def __init__(self, core, options: Optional[EarlyFusionOptions] = None):
        super().__init__(core, options or EarlyFusionOptions())
        width = core.config.language_model.hidden_size
        dims = {"text": width, "audio": core.speech_encoder.hidden_size, "video": core.video_encoder.hidden_size}
        options = self.options
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(core.config.seed + 11)
            if options.joint_encoder == "imagebind":
                self.joint, self.imagebind = None, _imagebind(options)
                joint_dim = self.imagebind.out_dim
            else:
                self.joint, self.imagebind = JointEmbedding(dims, options), None
                joint_dim = options.joint_dim
            # The paper's linear projector (one Linear), into prefix_tokens token embeddings.
            self.projector = SoftPrompt(joint_dim, width, options.prefix_tokens, None, word_length(core))

    def group_of(self, name: str) -> str:
        # ImageBind, when used, is frozen like the encoders (group "frozen": not saved).
        if name.startswith("joint."):
            return "joint_embedding"
        if name.startswith("projector."):
            return "soft_prompts"
        if name.startswith("core.language_model.") and "lora_" in name:
            return "lora"
        return "frozen"

    @classmethod
    def needs_init(cls, stage: Stage, options: EarlyFusionOptions) -> Optional[str]:
        if stage.name == "early_fusion_text" and options.joint_encoder == "ours":
            return "stage early_fusion_text reads the trained joint embedding: start it from early_fusion_joint's output"
        return None

    def set_stage(self, stage) -> "EarlyFusionModel":
        stage = get_stage(stage)
        if stage.name == "early_fusion_joint" and self.imagebind is not None:
            raise ValueError("ImageBind is a joint space already: with joint_encoder imagebind, skip early_fusion_joint")
        return super().set_stage(stage)

    def embed(self, batch) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """Each of ``modalities``' unit-length joint embedding ``(B, d)`` and ``(B,)`` True
        where the row has the modality."""
        if self.imagebind is not None:
            return self.imagebind_embeddings(batch)
        features, present = self.utterance_features(batch)
        return self.joint(features), present

    @torch.no_grad()
    def imagebind_embeddings(self, batch) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """ImageBind's embeddings of the utterance's text, speech and frames, each scaled to
        unit length: ImageBind's audio comes 20 long and its text about 14, which would
        drown the video in a sum."""
        imagebind, config = self.imagebind, self.config
        size = batch["input_ids"].shape[0]
        device = self.device
        embeddings, present = {}, {}
        if "text" in self.options.modalities:
            texts = batch["utterance_texts"]
            embeddings["text"] = imagebind.embed_text(imagebind.tokenize(texts).to(device))
            present["text"] = torch.tensor([bool(t.strip()) for t in texts], device=device)
        for modality in ("audio", "video"):
            rows = batch.get(f"{modality}_rows")
            if modality not in self.options.modalities or rows is None or rows.numel() == 0:
                continue
            if modality not in batch:
                raise ValueError("early fusion with ImageBind reads the raw speech and frames: "
                                 "data.media_cache holds only our encoders' features; leave it unset")
            if modality == "audio":
                clips = imagebind.embed_audio(batch["audio"], batch["audio_lengths"], config.speech_encoder.sample_rate)
            else:
                clips = imagebind.embed_vision(clip_frames(batch["video"], config.video_encoder,
                                                           imagebind.config.image_size), batch.get("video_lengths"))
            embeddings[modality], present[modality] = rows_mean(clips.float(), rows.to(device), size)
        return {m: F.normalize(e.float(), dim=-1) for m, e in embeddings.items()}, present

    def prefix(self, batch) -> torch.Tensor:
        """The projected fused embedding ``(B, prefix_tokens, H)``."""
        embeddings, present = self.embed(batch)
        if not embeddings:
            raise ValueError("early fusion reads the user's utterance, and none of its modalities "
                             f"{list(self.joint.modalities)} is in the batch")
        dtype = self.core.language_model.get_input_embeddings().weight.dtype
        return self.projector(JointEmbedding.fuse(embeddings, present)).to(dtype)

    def forward(self, batch, stage=None) -> Dict[str, torch.Tensor]:
        stage = get_stage(stage) if stage is not None else self.stage
        if stage is None:
            raise ValueError("set a stage first (model.set_stage('early_fusion_joint'))")
        if stage.name == "early_fusion_joint":
            embeddings, present = self.embed(batch)
            loss = self.joint.contrastive_loss(embeddings, present)
            return {"loss": loss, "loss_joint": loss, "logit_scale": self.joint.logit_scale.detach().exp().squeeze(0)}
        loss = self.prefixed_loss(self.prefix(batch), batch)
        return {"loss": loss, "loss_emp": loss}


class EarlyFusionSystem(PipelineSystem):
    """Early fusion answering: the meta-response written after the prepended joint
    embedding of the user's utterance."""

    name = "early_fusion"
    title = "Early fusion"

    def __init__(self, fusion: EarlyFusionModel, styles: StyleTable):
        super().__init__(fusion.core, styles)
        self.fusion = fusion

    def _network(self) -> nn.Module:
        return self.fusion

    def to(self, *args, **kwargs) -> "EarlyFusionSystem":
        self.fusion.to(*args, **kwargs)
        return self

    def write(self, items, max_new_tokens, decoding, progress=None):
        prefix = self.fusion.prefix(self.fusion.inference_batch(items, PromptMode.PIPELINE))
        return self.model.generate_text(items, PromptMode.PIPELINE, max_new_tokens, decoding, reserve_signals=False,
                                        score_steps=EMOTION_STEP_LIMIT, prefix=prefix, progress=progress)


def _imagebind(options: EarlyFusionOptions):
    """ImageBind at ``options``' size, with the checkpoint's weights where one is given."""
    import dataclasses

    from ..encoders.imagebind import ImageBind, ImageBindConfig

    if options.imagebind_size == "huge":
        config = ImageBindConfig.huge()
    else:
        # Test sizes, with the real vocabulary so that the OpenCLIP tokenizer's ids fit.
        config = dataclasses.replace(ImageBindConfig.tiny(), vocab_size=49408, context_length=77)
    model = ImageBind(config)
    if options.imagebind_checkpoint:
        model.load_checkpoint(options.imagebind_checkpoint)
    return model


def clip_frames(frames: torch.Tensor, video_config, image_size: int) -> torch.Tensor:
    """Our processor's frames ``(N, F, 3, S, S)`` (normalised with the preset's mean and
    std) as ImageBind reads them: CLIP's normalisation at ``image_size``."""
    from ..encoders.imagebind import CLIP_MEAN, CLIP_STD

    n, f = frames.shape[:2]
    mean = torch.tensor(video_config.mean, device=frames.device).view(1, 3, 1, 1)
    std = torch.tensor(video_config.std, device=frames.device).view(1, 3, 1, 1)
    pixels = frames.flatten(0, 1).float() * std + mean  # back to [0, 1]
    if pixels.shape[-1] != image_size:
        pixels = F.interpolate(pixels, size=(image_size, image_size), mode="bilinear", align_corners=False)
    clip_mean = torch.tensor(CLIP_MEAN, device=frames.device).view(1, 3, 1, 1)
    clip_std = torch.tensor(CLIP_STD, device=frames.device).view(1, 3, 1, 1)
    return ((pixels - clip_mean) / clip_std).view(n, f, 3, image_size, image_size)
