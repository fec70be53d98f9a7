"""Sizes, checkpoint paths and sampling settings of DreamTalk.

The defaults are the sizes of the published model (``configs/default.py`` and
``generators/renderer_conf.yaml`` of the official release), so ``DreamTalkConfig()`` builds
the architecture that ``denoising_network.pth`` and ``renderer.pt`` load into.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Optional, Tuple

# Which of the 64 expression coefficients (Basel Face Model basis of Deep3DFaceRecon) each
# of the two decoders predicts: one for the upper face, one for the mouth region.
UPPER_FACE_INDICES: Tuple[int, ...] = (6, 8) + tuple(range(15, 64))
LOWER_FACE_INDICES: Tuple[int, ...] = (0, 1, 2, 3, 4, 5, 7, 9, 10, 11, 12, 13, 14)

# Head pose the official renderer script uses when asked not to move the head: no rotation,
# no translation, and the crop parameters (scale, centre x, centre y) of a centred face.
NEUTRAL_POSE: Tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.9370641, 126.84911, 129.03864)


@dataclass
class DreamTalkConfig:
    """Everything that decides what :class:`~empatheia.generators.dreamtalk.DreamTalk` computes.

    Paths are local; nothing is ever downloaded. ``denoiser_checkpoint`` and
    ``renderer_checkpoint`` are the official files the authors hand out on request;
    ``wav2vec2`` is a local Hugging Face folder of ``wav2vec2-large-xlsr-53-english``
    (only needed to derive the content from speech).
    """

    # ---------------------------------------------------------------- weights
    denoiser_checkpoint: Optional[str] = None
    """``denoising_network.pth``: ``{"model_state_dict": {"diff_net.<name>": tensor}}``."""
    renderer_checkpoint: Optional[str] = None
    """``renderer.pt``: ``{"net_G_ema": {"<name>": tensor}}``."""
    wav2vec2: Optional[str] = None
    """Local folder of the wav2vec2-XLSR model whose last hidden states feed the content
    encoder (``Wav2Vec2Model.from_pretrained(path, local_files_only=True)``)."""
    trust_checkpoints: bool = False
    """Unpickle checkpoints with arbitrary Python objects in them (``weights_only=False``).
    Off by default: plain tensor checkpoints load without it."""
    device: str = "cpu"
    """Where :meth:`DreamTalk.from_pretrained` puts the model."""

    # ---------------------------------------------------------------- audio
    audio_feature_dim: int = 1024
    """Width of a wav2vec2 frame (hidden size of XLSR-53 large)."""
    audio_sample_rate: int = 16000
    normalize_audio: bool = True
    """Zero-mean, unit-variance waveform before wav2vec2, as its feature extractor does."""
    window: int = 5
    """Audio frames on each side of a video frame's centre: the content window holds
    ``2 * window + 1`` wav2vec2 frames (50 Hz) around frame ``i``'s centre ``2 * i``."""

    # ---------------------------------------------------------------- denoiser
    coeff_dim: int = 64
    """Expression coefficients per frame (the face model's expression basis)."""
    d_model: int = 256
    num_heads: int = 8
    ffn_dim: int = 1024
    dropout: float = 0.1
    """Dropout inside the transformers (only active in training mode)."""
    content_layers: int = 3
    style_layers: int = 3
    decoder_layers: int = 3
    style_max_len: int = 256
    """Frames of a reference clip the style encoder reads (its positional table size)."""
    upper_face_indices: Tuple[int, ...] = UPPER_FACE_INDICES
    lower_face_indices: Tuple[int, ...] = LOWER_FACE_INDICES

    # ---------------------------------------------------------------- diffusion
    diffusion_steps: int = 1000
    beta_start: float = 1e-4
    beta_end: float = 0.02
    ddim_steps: int = 10
    """DDIM steps at sampling (the official demo uses 10)."""
    guidance_scale: float = 1.0
    """Classifier-free guidance scale; 1.0 (the official default) is the conditional
    prediction alone, larger values exaggerate the speaking style."""
    seed: int = 0
    """Seed of the initial noise, so that the same inputs give the same motion."""

    # ---------------------------------------------------------------- renderer
    image_size: int = 256
    image_channels: int = 3
    pose_dim: int = 9
    """Per-frame pose the renderer reads after the expression: rotation (3),
    translation (3) and crop (scale, centre x, centre y)."""
    neutral_pose: Tuple[float, ...] = NEUTRAL_POSE
    semantic_radius: int = 13
    """The renderer reads a window of ``2 * radius + 1`` frames of coefficients per frame."""
    descriptor_dim: int = 256
    mapping_layers: int = 3
    max_channels: int = 256
    warp_base_channels: int = 32
    warp_encoder_layers: int = 5
    warp_decoder_layers: int = 3
    edit_base_channels: int = 64
    edit_layers: int = 3
    edit_res_blocks: int = 2
    adain_hidden: int = 128
    render_batch_size: int = 16
    """Frames rendered at once (bounds memory on long clips)."""

    def __post_init__(self) -> None:
        # YAML and JSON give lists; keep tuples so the config stays hashable and comparable.
        self.upper_face_indices = tuple(int(i) for i in self.upper_face_indices)
        self.lower_face_indices = tuple(int(i) for i in self.lower_face_indices)
        self.neutral_pose = tuple(float(v) for v in self.neutral_pose)
        indices = sorted(self.upper_face_indices + self.lower_face_indices)
        if indices != list(range(self.coeff_dim)):
            raise ValueError(
                "upper_face_indices and lower_face_indices must split range(coeff_dim) "
                f"({self.coeff_dim}) between them exactly once"
            )
        if len(self.neutral_pose) != self.pose_dim:
            raise ValueError(f"neutral_pose has {len(self.neutral_pose)} values, pose_dim is {self.pose_dim}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if not 0 < self.ddim_steps <= self.diffusion_steps:
            raise ValueError(f"ddim_steps must be in [1, {self.diffusion_steps}], got {self.ddim_steps}")
        if self.warp_decoder_layers > self.warp_encoder_layers:
            raise ValueError("warp_decoder_layers cannot exceed warp_encoder_layers")
        # The mapping net shrinks the window by 6 frames per convolution (kernel 7, then
        # kernel 3 at dilation 3) and must keep at least one frame.
        if 2 * self.semantic_radius + 1 - 6 * (self.mapping_layers + 1) < 1:
            raise ValueError("semantic_radius is too small for mapping_layers")
        stride = 2 ** max(self.warp_encoder_layers, self.edit_layers)
        if self.image_size % stride:
            raise ValueError(f"image_size {self.image_size} must be a multiple of {stride} for these layers")

    @property
    def window_frames(self) -> int:
        """Audio frames in one content window (11 in the published model)."""
        return 2 * self.window + 1

    @property
    def content_dim(self) -> int:
        """Width of a flattened content window: the video content feature C^v per frame."""
        return self.window_frames * self.d_model

    @classmethod
    def tiny(cls, **overrides) -> "DreamTalkConfig":
        """The same architecture at a few thousand parameters per block, for tests."""
        sizes = dict(
            audio_feature_dim=32,
            d_model=32,
            num_heads=2,
            ffn_dim=64,
            content_layers=1,
            style_layers=1,
            decoder_layers=1,
            style_max_len=64,
            ddim_steps=4,
            image_size=32,
            descriptor_dim=32,
            max_channels=32,
            warp_base_channels=8,
            warp_encoder_layers=3,
            warp_decoder_layers=2,
            edit_base_channels=8,
            edit_layers=2,
            edit_res_blocks=1,
            adain_hidden=16,
        )
        sizes.update(overrides)
        return cls(**sizes)

    def architecture_hash(self) -> str:
        """Short hash of the fields that shape the weights (not paths or sampling)."""
        skip = {"denoiser_checkpoint", "renderer_checkpoint", "wav2vec2", "trust_checkpoints", "device",
                "ddim_steps", "guidance_scale", "seed", "render_batch_size"}
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
