"""ImageBind (Girdhar et al., CVPR 2023) for the early-fusion variant (§2.2, §4.3): one
frozen model that embeds the user's video, audio and text into one joint space.

Each modality has a preprocessor (patch or token embedding, a class token, learned
positional embeddings), a transformer trunk, a head (a layer norm and a bias-free linear
map of one token into the ``out_embed_dim``-d joint space) and a postprocessor (L2
normalisation, then for text and audio a multiplication by a logit scale):

- vision: OpenCLIP's ViT-H/14 turned into a video model: a ``Conv3d`` with kernel and
  stride ``(2, 14, 14)`` cuts a two-frame clip of 224×224 frames into 2×14×14 tubelets
  (a single image is repeated to two frames); a layer norm before the first block; the
  head reads the class token. No logit scale.
- text: OpenCLIP's causal text transformer over 77 BPE tokens; the head reads the token
  at the end-of-text position (the largest id of a row, ``<end_of_text>`` being the last
  id of the vocabulary); the logit scale is learned (a parameter).
- audio: a ViT-B over a 128×204 log-mel spectrogram of a 2 s clip, cut into 16×16
  patches with stride 10 (12×19 patches) and layer-normed; the attention layers have
  learned key/value bias tokens; the head reads the class token; the logit scale is
  fixed at 20 (a buffer).

Audio and video come as several clips: every clip is embedded and postprocessed, then
the clips of an input are averaged, so those embeddings are means of normalised vectors
(norm at most 1 for vision, at most 20 for audio), exactly as ImageBind's ``forward``
returns them.

Text comes in as OpenCLIP BPE token ids; :meth:`ImageBind.tokenize` makes them with
``open_clip.get_tokenizer("ViT-H-14")`` (open_clip_torch is a dependency of the package),
which gives the same ids as ImageBind's own tokenizer.

The submodules are named so that :meth:`ImageBind.state_dict` has exactly the keys and
shapes of the vision, text and audio parts of the public ``imagebind_huge.pth``
(:meth:`ImageBindConfig.huge`). ImageBind's other three modalities (depth, thermal,
IMU) are left out: :meth:`ImageBind.load_checkpoint` skips their keys and reports them.
Dropout and stochastic depth are left out as well: they hold no weights and the model is
frozen, always in eval mode.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .frozen import FrozenEncoder

logger = logging.getLogger(__name__)

MODALITIES = ("vision", "text", "audio")
# The modalities of imagebind_huge.pth that this module does not build.
SKIPPED_MODALITIES = ("depth", "thermal", "imu")
_PARTS = ("modality_preprocessors", "modality_trunks", "modality_heads", "modality_postprocessors")

# The normalisation of ImageBind's (and OpenAI CLIP's) image and video transforms.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_LN_EPS = 1e-6  # every layer norm of the trunks and heads; the audio stem's norm keeps torch's 1e-5


@dataclass
class ImageBindConfig:
    """Sizes of the three trunks, the joint space and the fixed front-end constants."""

    out_embed_dim: int = 1024

    vision_embed_dim: int = 1280
    vision_num_blocks: int = 32
    vision_num_heads: int = 16
    image_size: int = 224
    patch_size: int = 14
    frames_per_clip: int = 2  # the tubelet's temporal kernel

    text_embed_dim: int = 1024
    text_num_blocks: int = 24
    text_num_heads: int = 16
    vocab_size: int = 49408
    context_length: int = 77
    text_logit_scale_init: float = 1 / 0.07

    audio_embed_dim: int = 768
    audio_num_blocks: int = 12
    audio_num_heads: int = 12
    audio_patch_size: int = 16
    audio_patch_stride: int = 10
    num_mel_bins: int = 128
    audio_target_length: int = 204  # spectrogram frames per clip, 10 ms apart
    audio_sample_rate: int = 16000
    audio_clip_seconds: float = 2.0
    audio_clips: int = 3
    audio_mean: float = -4.268
    audio_std: float = 9.138
    audio_logit_scale: float = 20.0

    max_logit_scale: float = 100.0

    @classmethod
    def huge(cls) -> "ImageBindConfig":
        """imagebind_huge: ViT-H/14 vision (1280 wide, 32 blocks), OpenCLIP ViT-H text
        (1024 wide, 24 blocks), ViT-B audio (768 wide, 12 blocks), a 1024-d joint space."""
        return cls()

    @classmethod
    def tiny(cls) -> "ImageBindConfig":
        """The same structure at test sizes: narrow, two-block trunks, 28×28 frames, a
        small vocabulary; the audio front end (fbank, clips, 128×204 spectrograms) is
        the real one."""
        return cls(
            out_embed_dim=16,
            vision_embed_dim=32,
            vision_num_blocks=2,
            vision_num_heads=4,
            image_size=28,
            text_embed_dim=32,
            text_num_blocks=2,
            text_num_heads=4,
            vocab_size=1000,
            context_length=16,
            audio_embed_dim=32,
            audio_num_blocks=2,
            audio_num_heads=4,
        )

    @property
    def vision_grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def audio_grid(self) -> Tuple[int, int]:
        """Patch rows (mel) and columns (time) of one clip's spectrogram."""
        k, s = self.audio_patch_size, self.audio_patch_stride
        return (self.num_mel_bins - k) // s + 1, (self.audio_target_length - k) // s + 1


class ImageBindCheckpointError(ValueError):
    """A checkpoint whose vision, text or audio weights do not fit the model."""


@dataclass
class ImageBindLoadReport:
    """What :meth:`ImageBind.load_checkpoint` did with each key of the file."""

    path: str
    loaded: List[str]
    skipped: List[str]  # keys of depth, thermal and IMU
    missing: List[str] = field(default_factory=list)  # left as they were (strict=False only)
    unexpected: List[str] = field(default_factory=list)  # ignored (strict=False only)

    def summary(self) -> str:
        lines = [f"{self.path}: loaded {len(self.loaded)} tensors"]
        if self.skipped:
            prefixes = sorted({".".join(k.split(".")[:2]) for k in self.skipped})
            lines.append(f"skipped {len(self.skipped)} keys of modalities not built here: {', '.join(prefixes)}")
        if self.missing:
            lines.append(f"missing (kept as initialised): {_listing(self.missing)}")
        if self.unexpected:
            lines.append(f"unexpected (ignored): {_listing(self.unexpected)}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- building blocks


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Block(nn.Module):
    """A pre-norm transformer block: x + attn(norm_1(x)), then x + mlp(norm_2(x))."""

    def __init__(self, dim: int, heads: int, add_bias_kv: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, bias=True, add_bias_kv=add_bias_kv, batch_first=True)
        self.norm_1 = nn.LayerNorm(dim, eps=_LN_EPS)
        self.mlp = _Mlp(dim, 4 * dim)
        self.norm_2 = nn.LayerNorm(dim, eps=_LN_EPS)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> torch.Tensor:
        h = self.norm_1(x)
        x = x + self.attn(h, h, h, attn_mask=attn_mask, need_weights=False)[0]
        return x + self.mlp(self.norm_2(x))


class _Trunk(nn.Module):
    """``(N, L, D)`` tokens through an optional layer norm and ``num_blocks`` blocks."""

    def __init__(self, dim: int, num_blocks: int, heads: int, norm_first: bool, add_bias_kv: bool):
        super().__init__()
        # Indexed like the checkpoint: the norm is element 0 of the pre-transformer layer.
        self.pre_transformer_layer = nn.Sequential(nn.LayerNorm(dim, eps=_LN_EPS)) if norm_first else nn.Identity()
        self.blocks = nn.ModuleList(_Block(dim, heads, add_bias_kv) for _ in range(num_blocks))

    def forward(self, tokens: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        tokens = self.pre_transformer_layer(tokens)
        for block in self.blocks:
            tokens = block(tokens, attn_mask)
        return tokens


class _RepeatSingleFrame(nn.Module):
    """``(N, C, H, W)`` images or one-frame clips become ``frames``-frame clips by
    repetition; clips with more frames pass unchanged. Holds no weights (it is element 0
    of the vision stem, before the tubelet convolution)."""

    def __init__(self, frames: int):
        super().__init__()
        self.frames = frames

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 4:
            x = x.unsqueeze(2)
        if x.shape[2] == 1:
            x = x.expand(-1, -1, self.frames, -1, -1)
        return x


class _PatchStem(nn.Module):
    """Patch projection, flattened to ``(N, patches, D)``, then an optional layer norm."""

    def __init__(self, proj: nn.Module, norm_layer: Optional[nn.Module] = None):
        super().__init__()
        self.proj = proj
        self.norm_layer = norm_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x).flatten(2).transpose(1, 2)
        return self.norm_layer(x) if self.norm_layer is not None else x


class _PositionalEmbedding(nn.Module):
    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.pos_embed = nn.Parameter(torch.empty(1, tokens, dim))


class _PatchPreprocessor(nn.Module):
    """Vision and audio input: stem patches, a class token in front, positions added."""

    def __init__(self, stem: _PatchStem, num_patches: int, dim: int):
        super().__init__()
        self.rgbt_stem = stem  # the checkpoint's name, for audio as well
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
        self.pos_embedding_helper = _PositionalEmbedding(num_patches + 1, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.rgbt_stem(x)
        pos = self.pos_embedding_helper.pos_embed
        if patches.shape[1] + 1 != pos.shape[1]:
            raise ValueError(f"input gives {patches.shape[1]} patches; the positional embedding has {pos.shape[1] - 1}")
        tokens = torch.cat([self.cls_token.expand(patches.shape[0], -1, -1), patches], dim=1)
        return tokens + pos


class _TextPreprocessor(nn.Module):
    def __init__(self, vocab_size: int, context_length: int, dim: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Parameter(torch.empty(1, context_length, dim))
        # Additive causal mask, -inf above the diagonal; the checkpoint stores it.
        self.register_buffer("mask", torch.full((context_length, context_length), float("-inf")).triu(1))

    def forward(self, token_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        length = token_ids.shape[1]
        # With causal attention, tokens after a row's end-of-text never reach it, so a
        # sequence shorter than the context gives the same embedding as its padded form.
        tokens = self.token_embedding(token_ids) + self.pos_embed[:, :length]
        return tokens, self.mask[:length, :length]


class _SelectToken(nn.Module):
    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.index]


class _TextHead(nn.Module):
    """The token at each row's end-of-text position, layer-normed and projected."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(dim, eps=_LN_EPS), nn.Linear(dim, out_dim, bias=False))

    def forward(self, x: torch.Tensor, eos_index: torch.Tensor) -> torch.Tensor:
        return self.proj(x[torch.arange(x.shape[0], device=x.device), eos_index])


def _token_head(dim: int, out_dim: int) -> nn.Sequential:
    # norm (element 0), class token (1, no weights), projection (2)
    return nn.Sequential(nn.LayerNorm(dim, eps=_LN_EPS), _SelectToken(0), nn.Linear(dim, out_dim, bias=False))


class _L2Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1, p=2)


class _LogitScale(nn.Module):
    """Multiplies by ``min(exp(log_logit_scale), max_scale)``. ImageBind learnt the text's
    scale (a parameter there) and fixed the audio's; frozen here, both are saved buffers
    under the checkpoint's key, which load the same. (A 0-d parameter would also be
    broadcast as bytes by DeepSpeed, which cannot view a 0-d tensor so.)"""

    def __init__(self, init: float, max_scale: float):
        super().__init__()
        self.max_scale = max_scale
        self.register_buffer("log_logit_scale", torch.tensor(math.log(init), dtype=torch.float32))

    @property
    def scale(self) -> torch.Tensor:
        return self.log_logit_scale.exp().clamp(max=self.max_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


# ---------------------------------------------------------------------------- the model


class ImageBind(FrozenEncoder):
    """ImageBind's vision, text and audio encoders into one ``out_embed_dim``-d space.

    ``embed_vision``, ``embed_audio`` and ``embed_text`` take raw-ish inputs (normalised
    frames, waveforms, token ids) and return the postprocessed joint embeddings;
    ``forward`` takes ImageBind's own preprocessed inputs, a dict by modality, and returns
    what ImageBind's ``forward`` returns for them.
    """

    def __init__(self, config: Optional[ImageBindConfig] = None):
        super().__init__()
        self.config = config = config or ImageBindConfig.huge()
        for name in MODALITIES:
            dim, heads = getattr(config, f"{name}_embed_dim"), getattr(config, f"{name}_num_heads")
            if dim % heads:
                raise ValueError(f"{name}_embed_dim {dim} is not divisible by {name}_num_heads {heads}")
        if config.image_size % config.patch_size:
            raise ValueError(f"image_size {config.image_size} is not a multiple of patch_size {config.patch_size}")
        vd, td, ad, out = config.vision_embed_dim, config.text_embed_dim, config.audio_embed_dim, config.out_embed_dim

        tubelet = (config.frames_per_clip, config.patch_size, config.patch_size)
        vision_stem = _PatchStem(
            nn.Sequential(
                _RepeatSingleFrame(config.frames_per_clip),
                nn.Conv3d(3, vd, kernel_size=tubelet, stride=tubelet, bias=False),
            )
        )
        audio_stem = _PatchStem(
            nn.Conv2d(1, ad, kernel_size=config.audio_patch_size, stride=config.audio_patch_stride, bias=False),
            norm_layer=nn.LayerNorm(ad),
        )
        rows, cols = config.audio_grid
        self.modality_preprocessors = nn.ModuleDict(
            {
                "vision": _PatchPreprocessor(vision_stem, config.vision_grid**2, vd),
                "text": _TextPreprocessor(config.vocab_size, config.context_length, td),
                "audio": _PatchPreprocessor(audio_stem, rows * cols, ad),
            }
        )
        self.modality_trunks = nn.ModuleDict(
            {
                "vision": _Trunk(vd, config.vision_num_blocks, config.vision_num_heads, True, False),
                "text": _Trunk(td, config.text_num_blocks, config.text_num_heads, False, False),
                "audio": _Trunk(ad, config.audio_num_blocks, config.audio_num_heads, False, True),
            }
        )
        self.modality_heads = nn.ModuleDict(
            {"vision": _token_head(vd, out), "text": _TextHead(td, out), "audio": _token_head(ad, out)}
        )
        self.modality_postprocessors = nn.ModuleDict(
            {
                "vision": _L2Normalize(),
                "text": nn.Sequential(
                    _L2Normalize(), _LogitScale(config.text_logit_scale_init, config.max_logit_scale)
                ),
                "audio": nn.Sequential(
                    _L2Normalize(), _LogitScale(config.audio_logit_scale, config.max_logit_scale)
                ),
            }
        )
        self._init_weights()
        self.freeze()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """Random weights at sensible scales (OpenCLIP-style class and position tokens);
        :meth:`load_checkpoint` replaces them all."""
        for name in ("vision", "audio"):
            pre = self.modality_preprocessors[name]
            scale = pre.cls_token.shape[-1] ** -0.5
            nn.init.normal_(pre.cls_token, std=scale)
            nn.init.normal_(pre.pos_embedding_helper.pos_embed, std=scale)
        text = self.modality_preprocessors["text"]
        nn.init.normal_(text.token_embedding.weight, std=0.02)
        nn.init.normal_(text.pos_embed, std=0.01)
        for trunk in self.modality_trunks.values():
            for module in trunk.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)

    @property
    def out_dim(self) -> int:
        return self.config.out_embed_dim

    @property
    def _device(self) -> torch.device:
        return self.modality_preprocessors["vision"].cls_token.device

    @property
    def _dtype(self) -> torch.dtype:
        return self.modality_preprocessors["vision"].cls_token.dtype

    # ------------------------------------------------------------------ the shared path

    def _encode(self, modality: str, value: torch.Tensor) -> torch.Tensor:
        """One batch of single clips (or token rows) to ``(N, out_embed_dim)``."""
        if modality == "text":
            tokens, mask = self.modality_preprocessors["text"](value)
            hidden = self.modality_trunks["text"](tokens, mask)
            # ImageBind's end-of-text position: the largest id of each row.
            embedded = self.modality_heads["text"](hidden, value.argmax(dim=-1))
        else:
            tokens = self.modality_preprocessors[modality](value)
            embedded = self.modality_heads[modality](self.modality_trunks[modality](tokens))
        return self.modality_postprocessors[modality](embedded)

    @torch.no_grad()
    def forward(self, inputs: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """ImageBind's forward for preprocessed inputs.

        Args:
            inputs: by modality: ``vision`` ``(N, 3, S, S)`` images or ``(N, 3, 2, S, S)``
                clips, or ``(N, K, 3, 2, S, S)`` K clips each; ``text`` ``(N, L)`` token
                ids; ``audio`` ``(N, 1, mel, T)`` spectrograms or ``(N, K, 1, mel, T)``.

        Returns:
            ``(N, out_embed_dim)`` per modality; with K clips, the mean of the K clips'
            postprocessed embeddings.
        """
        outputs = {}
        for modality, value in inputs.items():
            if modality not in MODALITIES:
                raise ValueError(f"ImageBind here embeds {list(MODALITIES)}, not {modality!r}")
            value = value.to(self._device)
            if modality != "text":
                value = value.to(self._dtype)
            if value.ndim >= 5 and not (modality == "vision" and value.ndim == 5):
                n, k = value.shape[:2]
                embedded = self._encode(modality, value.flatten(0, 1))
                outputs[modality] = embedded.view(n, k, -1).mean(dim=1)
            else:
                outputs[modality] = self._encode(modality, value)
        return outputs

    # ------------------------------------------------------------------ vision

    @torch.no_grad()
    def embed_vision(self, frames: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Video clips (or images) to joint embeddings.

        Each input's valid frames are paired in order, (0, 1), (2, 3), ..., into two-frame
        clips (the 2×14×14 tubelets of ImageBind's stem); an odd last frame is repeated, as
        ImageBind repeats a single image. Every clip is embedded and normalised, and an
        input's clips are averaged, as ImageBind averages the clips of a video. Frames
        sampled as ImageBind's ``load_and_transform_video_data`` samples them (two per
        clip, clip after clip, the spatial crops as further clips) give exactly its video
        embedding.

        Args:
            frames: ``(B, F, 3, S, S)`` frames in [0, 1] normalised with :data:`CLIP_MEAN`
                and :data:`CLIP_STD`, zero-padded after ``lengths``; or ``(B, 3, S, S)``
                images. ``S`` is ``config.image_size`` (224).
            lengths: ``(B,)`` valid frames per input (default: all ``F``).

        Returns:
            ``(B, out_embed_dim)``: unit norm for an input of one clip (one or two frames),
            a mean of unit vectors otherwise.
        """
        if frames.ndim == 4:
            frames = frames.unsqueeze(1)
        if frames.ndim != 5 or frames.shape[2] != 3:
            raise ValueError(f"frames must be (B, F, 3, S, S) or (B, 3, S, S), got {tuple(frames.shape)}")
        size = self.config.image_size
        if tuple(frames.shape[-2:]) != (size, size):
            raise ValueError(f"frames are {tuple(frames.shape[-2:])}; ImageBind takes {size}×{size}")
        b, f = frames.shape[:2]
        lengths = torch.full((b,), f) if lengths is None else torch.as_tensor(lengths).cpu()
        clips, owners = [], []
        for row, n in enumerate(lengths.tolist()):
            if not 1 <= n <= f:
                raise ValueError(f"row {row}: {n} valid frames, need 1 to {f}")
            order = list(range(n)) + ([n - 1] if n % 2 else [])
            pairs = frames[row, order].view(-1, 2, *frames.shape[2:])  # (P, 2, 3, S, S)
            clips.append(pairs.transpose(1, 2))  # (P, 3, 2, S, S): time is the Conv3d's depth
            owners += [row] * pairs.shape[0]
        embedded = self._encode("vision", torch.cat(clips).to(self._device, self._dtype))
        return _mean_by_owner(embedded, torch.tensor(owners, device=embedded.device), b)

    # ------------------------------------------------------------------ audio

    def audio_clip_bounds(self, num_samples: int) -> List[Tuple[int, int]]:
        """``(start, end)`` sample indices of the clips of ``num_samples`` samples at
        ``config.audio_sample_rate``, as ImageBind's data pipeline places them (pytorchvideo's
        ``ConstantClipsPerVideoSampler`` at the commit ImageBind pins): ``audio_clips``
        clips of ``audio_clip_seconds``, the i-th starting at
        ``i * max(duration - clip, 0) / (audio_clips - 1)`` seconds, so the first starts at
        the beginning and the last ends at the end; clips overlap when the audio is
        shorter than ``audio_clips`` clips. Audio no longer than one clip gives that many
        copies of the whole audio. (pytorchvideo before its April 2022 fix divided by
        ``audio_clips`` instead and never reached the end.)"""
        c = self.config
        duration = num_samples / c.audio_sample_rate
        step = Fraction(max(duration - c.audio_clip_seconds, 0)) / max(c.audio_clips - 1, 1)
        clip = Fraction(c.audio_clip_seconds)
        bounds = []
        for i in range(c.audio_clips):
            start = step * i
            end = min(int((start + clip) * c.audio_sample_rate), num_samples)
            bounds.append((int(start * c.audio_sample_rate), end))
        return bounds

    def spectrograms(self, audio: torch.Tensor) -> torch.Tensor:
        """``(audio_clips, 1, num_mel_bins, audio_target_length)`` normalised log-mel
        inputs of one mono waveform at ``config.audio_sample_rate``, as ImageBind's
        ``load_and_transform_audio_data`` makes them.

        For each clip of :meth:`audio_clip_bounds`, in order: the clip's mean is
        subtracted (in place in a copy of the whole waveform, as ImageBind subtracts it
        in place in a view, so a later clip sees the earlier clips' means removed where
        they overlap); a Kaldi-compatible fbank (25 ms Hann windows every 10 ms, no dither,
        HTK-compatible mel bins); cut or zero-padded at the end to the target length; then
        normalised with ``audio_mean`` and ``audio_std``, padding included."""
        from torchaudio.compliance import kaldi

        c = self.config
        audio = audio.to(torch.float32).clone()
        clips = []
        for start, end in self.audio_clip_bounds(audio.shape[0]):
            clip = audio[start:end]
            clip -= clip.mean()
            fbank = kaldi.fbank(
                clip[None],
                htk_compat=True,
                sample_frequency=c.audio_sample_rate,
                use_energy=False,
                window_type="hanning",
                num_mel_bins=c.num_mel_bins,
                dither=0.0,
                frame_length=25,
                frame_shift=10,
            ).T  # (mel, frames)
            missing = c.audio_target_length - fbank.shape[1]
            fbank = F.pad(fbank, (0, missing)) if missing > 0 else fbank[:, : c.audio_target_length]
            clips.append(((fbank - c.audio_mean) / c.audio_std)[None])
        return torch.stack(clips)

    @torch.no_grad()
    def embed_audio(
        self, waveforms: torch.Tensor, lengths: Optional[torch.Tensor] = None, sample_rate: int = 16000
    ) -> torch.Tensor:
        """Mono waveforms to joint embeddings.

        Each input's valid samples are resampled to ``config.audio_sample_rate`` (16 kHz)
        if needed, cut into ``audio_clips`` (3) clips of 2 s (:meth:`audio_clip_bounds`),
        each turned into a log-mel spectrogram (:meth:`spectrograms`; a clip shorter than 2 s
        is zero-padded in the spectrogram, a longer one cannot occur), embedded and scaled,
        and the clips averaged. Padding after ``lengths`` is never read.

        Args:
            waveforms: ``(B, T)`` mono audio at ``sample_rate``, zero-padded after ``lengths``.
            lengths: ``(B,)`` valid samples per input (default: all ``T``).
            sample_rate: of ``waveforms``.

        Returns:
            ``(B, out_embed_dim)``: the mean of the clips' embeddings, each of norm
            ``audio_logit_scale`` (20); audio of at most 2 s has three identical clips, so
            its embedding has norm 20.
        """
        if waveforms.ndim != 2:
            raise ValueError(f"waveforms must be (B, T) mono audio, got {tuple(waveforms.shape)}")
        b, t = waveforms.shape
        lengths = torch.full((b,), t) if lengths is None else torch.as_tensor(lengths).cpu()
        c = self.config
        window = int(0.025 * c.audio_sample_rate)
        spectrograms = []
        for row, n in enumerate(lengths.tolist()):
            if not 0 <= n <= t:
                raise ValueError(f"row {row}: length {n} outside 0..{t}")
            audio = waveforms[row, :n].to(torch.float32)
            if sample_rate != c.audio_sample_rate:
                from torchaudio.functional import resample

                audio = resample(audio, orig_freq=sample_rate, new_freq=c.audio_sample_rate)
            if audio.shape[0] < window:
                raise ValueError(
                    f"row {row}: {audio.shape[0]} samples at {c.audio_sample_rate} Hz is shorter than one 25 ms "
                    f"spectrogram window ({window} samples)"
                )
            spectrograms.append(self.spectrograms(audio))
        batch = torch.cat(spectrograms).to(self._device, self._dtype)  # (B * clips, 1, mel, T)
        return self._encode("audio", batch).view(b, c.audio_clips, -1).mean(dim=1)

    # ------------------------------------------------------------------ text

    @torch.no_grad()
    def embed_text(self, token_ids: torch.Tensor) -> torch.Tensor:
        """OpenCLIP BPE token ids to joint embeddings.

        Args:
            token_ids: ``(B, L)`` ids, ``L <= context_length`` (77): ``<start_of_text>``,
                the text, ``<end_of_text>`` (the largest id, 49407), zeros after, as
                :meth:`tokenize` (or ``open_clip.get_tokenizer("ViT-H-14")``) gives them.

        Returns:
            ``(B, out_embed_dim)`` of norm ``min(exp(log_logit_scale), 100)``: the text
            postprocessor multiplies the unit embedding by its learned logit scale.
        """
        if token_ids.ndim != 2:
            raise ValueError(f"token_ids must be (B, L), got {tuple(token_ids.shape)}")
        if token_ids.dtype.is_floating_point:
            raise ValueError(f"token_ids must be integer ids, got {token_ids.dtype}")
        c = self.config
        if token_ids.shape[1] > c.context_length:
            raise ValueError(f"token_ids have {token_ids.shape[1]} positions; the context is {c.context_length}")
        if token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= c.vocab_size):
            raise ValueError(f"token ids must lie in [0, {c.vocab_size})")
        return self._encode("text", token_ids.to(self._device, torch.long))

    def tokenize(self, texts: Union[str, Sequence[str]]) -> torch.Tensor:
        """``(B, context_length)`` ids from OpenCLIP's BPE tokenizer for ViT-H-14 (the same
        vocabulary, lower-casing, start/end tokens and truncation as ImageBind's own)."""
        import open_clip

        if self.config.vocab_size != 49408:
            raise ValueError(
                f"the OpenCLIP tokenizer needs a vocabulary of 49408, this model has {self.config.vocab_size}"
            )
        tokenizer = open_clip.get_tokenizer("ViT-H-14", context_length=self.config.context_length)
        return tokenizer([texts] if isinstance(texts, str) else list(texts))

    # ------------------------------------------------------------------ checkpoints

    def load_checkpoint(self, path: Union[str, Path], strict: bool = True) -> ImageBindLoadReport:
        """Load the vision, text and audio weights of ``imagebind_huge.pth`` (a plain state
        dict) or of any state dict with the same key names.

        Keys of depth, thermal and IMU are skipped and listed in the report (and logged).
        With ``strict``, any missing or unexpected key of the three modalities is an error;
        a shape mismatch always is. Every error names its keys. A model built on the
        ``meta`` device takes the loaded tensors as they are (``assign``).
        """
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ImageBindCheckpointError(f"{path}: not a plain state dict of tensors")
        kept, skipped = {}, []
        for key, tensor in state.items():
            parts = key.split(".")
            if len(parts) > 1 and parts[0] in _PARTS and parts[1] in SKIPPED_MODALITIES:
                skipped.append(key)
            else:
                kept[key] = tensor
        own = self.state_dict()
        missing = sorted(k for k in own if k not in kept)
        unexpected = sorted(k for k in kept if k not in own)
        mismatched = [
            f"{k}: checkpoint {tuple(kept[k].shape)}, model {tuple(own[k].shape)}"
            for k in sorted(own)
            if k in kept and kept[k].shape != own[k].shape
        ]
        problems = []
        if mismatched:
            problems.append(f"{len(mismatched)} shape mismatch(es): {_listing(mismatched)}")
        if strict and missing:
            problems.append(f"{len(missing)} missing key(s): {_listing(missing)}")
        if strict and unexpected:
            problems.append(f"{len(unexpected)} unexpected key(s): {_listing(unexpected)}")
        assign = any(t.is_meta for t in own.values())
        if assign and missing and not strict:
            problems.append(
                f"the model is on the meta device, so missing keys would stay unallocated: {_listing(missing)}"
            )
        if problems:
            raise ImageBindCheckpointError(f"{path} does not fit ImageBind: " + "; ".join(problems))
        loadable = {k: v for k, v in kept.items() if k in own}
        self.load_state_dict(loadable, strict=strict, assign=assign)
        self.freeze()
        report = ImageBindLoadReport(str(path), sorted(loadable), sorted(skipped), missing, unexpected)
        logger.info(report.summary())
        return report


def _mean_by_owner(values: torch.Tensor, owners: torch.Tensor, count: int) -> torch.Tensor:
    """``(count, D)`` means of the rows of ``values`` grouped by ``owners``."""
    sums = values.new_zeros(count, values.shape[1]).index_add_(0, owners, values)
    sizes = torch.bincount(owners, minlength=count).clamp(min=1).to(values.dtype)
    return sums / sizes[:, None]


def _listing(items: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")
