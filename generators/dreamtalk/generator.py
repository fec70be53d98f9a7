"""DreamTalk as Empatheia's talking-head generator.

Speech (or a ready video content feature C^v) + a ready style code S^v + a portrait ->
25 fps frames:

1. content: wav2vec2-XLSR features of the 16 kHz speech (50 Hz), an 11-frame window per
   video frame, the content encoder -> ``(L, 11, 256)``; or C^v ``(L, 2816)`` as given;
2. motion: DDIM sampling of the diffusion denoiser, conditioned on the content and the
   style code (classifier-free guidance against the null style) -> ``(L, 64)``
   expression coefficients;
3. frames: the renderer warps the 256 x 256 portrait by a window of coefficients (+ a
   head pose, neutral by default) around each frame.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from empatheia.feature_sizes import DREAMTALK_FEATURES
from empatheia.io import file_digest

from ..base import PathLike, TalkingHeadGenerator, VideoFrames, Waveform, expand_units, resample_rows
from .checkpoints import (
    DENOISER_PREFIX,
    CheckpointError,
    denoiser_state_dict,
    load_strict,
    read_checkpoint,
    renderer_state_dict,
)
from .coefficients import (
    CoefficientReader,
    expression_coefficients,
    find_coefficient_file,
    is_coefficient_file,
    read_coefficient_array,
)
from .config import DreamTalkConfig
from .content_encoder import audio_windows
from .diffusion import DiffusionNetwork
from .renderer import FaceRenderer, motion_windows

_MIN_WAV2VEC2_SAMPLES = 400
"""wav2vec2's convolutional front end needs 25 ms at 16 kHz for one frame."""


class DreamTalk(nn.Module, TalkingHeadGenerator):
    """The DreamTalk talking-head generator.

    Build it with random weights from a config (``DreamTalk(DreamTalkConfig.tiny())``), or
    with the official weights: ``DreamTalk.from_pretrained(DreamTalkConfig(
    denoiser_checkpoint=..., renderer_checkpoint=..., wav2vec2=...))``.

    Args:
        config: sizes, paths and sampling settings; the published sizes by default. The
            model is built on ``config.device``.
        wav2vec2: a ready ``Wav2Vec2Model`` (e.g. a tiny random one in tests); otherwise
            it is loaded from ``config.wav2vec2`` the first time content is derived from
            audio.
        coefficient_reader: ``video path -> (F, 64 | 73 | 257)`` coefficients for
            :meth:`style_features`; without it, coefficients are read from files next to
            the videos (see :mod:`empatheia.generators.dreamtalk.coefficients`).
        seed: seed of the random initial weights.
    """

    features = DREAMTALK_FEATURES
    fps = 25.0

    def __init__(
        self,
        config: Optional[DreamTalkConfig] = None,
        *,
        wav2vec2: Optional[nn.Module] = None,
        coefficient_reader: Optional[CoefficientReader] = None,
        seed: int = 0,
    ):
        super().__init__()
        self.config = config = config or DreamTalkConfig()
        # Seeded without touching the caller's global random state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.diffusion = DiffusionNetwork(config)
            self.renderer = FaceRenderer(config)
        self._wav2vec2 = wav2vec2
        self.coefficient_reader = coefficient_reader
        self._weights = {"denoiser": f"random-seed-{seed}", "renderer": f"random-seed-{seed}"}
        self._wav2vec2_fingerprint: Optional[str] = None
        if (config.content_dim, config.d_model) != (DREAMTALK_FEATURES.content_dim, DREAMTALK_FEATURES.style_dim):
            # Smaller test configs read and write smaller features.
            self.features = dataclasses.replace(DREAMTALK_FEATURES, content_dim=config.content_dim, style_dim=config.d_model)
        self.to(config.device).eval()

    # ------------------------------------------------------------------ weights
    @classmethod
    def from_pretrained(
        cls,
        config: DreamTalkConfig,
        *,
        wav2vec2: Optional[nn.Module] = None,
        coefficient_reader: Optional[CoefficientReader] = None,
    ) -> "DreamTalk":
        """Build the architecture of ``config`` on ``config.device`` and load both official
        checkpoints into it strictly (see :mod:`empatheia.generators.dreamtalk.checkpoints`)."""
        missing = [name for name in ("denoiser_checkpoint", "renderer_checkpoint") if not getattr(config, name)]
        if missing:
            raise CheckpointError(f"DreamTalkConfig.{' and '.join(missing)} not set: DreamTalk needs both official checkpoints")
        model = cls(config, wav2vec2=wav2vec2, coefficient_reader=coefficient_reader)
        model.load_checkpoints(config.denoiser_checkpoint, config.renderer_checkpoint)
        return model

    def load_checkpoints(self, denoiser: Optional[PathLike] = None, renderer: Optional[PathLike] = None) -> None:
        """Load ``denoising_network.pth`` and/or ``renderer.pt``; each must fit exactly."""
        trust = self.config.trust_checkpoints
        if denoiser is not None:
            state = denoiser_state_dict(read_checkpoint(denoiser, trust), denoiser)
            load_strict(self.diffusion, state, denoiser, prefix=DENOISER_PREFIX)
            self._weights["denoiser"] = "sha256:" + file_digest(denoiser)[:16]
        if renderer is not None:
            state = renderer_state_dict(read_checkpoint(renderer, trust), renderer)
            load_strict(self.renderer, state, renderer)
            self._weights["renderer"] = "sha256:" + file_digest(renderer)[:16]

    def fingerprint(self) -> str:
        """Identifies the architecture and every set of weights the outputs depend on."""
        return (
            f"DreamTalk(arch={self.config.architecture_hash()}, denoiser={self._weights['denoiser']}, "
            f"renderer={self._weights['renderer']}, wav2vec2={self._wav2vec2_identity()})"
        )

    @property
    def device(self) -> torch.device:
        return self.diffusion.null_style_clip.device

    @property
    def wav2vec2(self) -> nn.Module:
        """The audio feature model, loaded from ``config.wav2vec2`` on first use."""
        if self._wav2vec2 is None:
            if not self.config.wav2vec2:
                raise ValueError(
                    "DreamTalk needs wav2vec2 to derive the content from speech: set DreamTalkConfig.wav2vec2 "
                    "to a local wav2vec2-large-xlsr-53-english folder, pass wav2vec2=, or pass the content"
                )
            path = Path(self.config.wav2vec2)
            if not path.is_dir():
                raise FileNotFoundError(f"{path}: wav2vec2 folder not found (DreamTalkConfig.wav2vec2)")
            from transformers import Wav2Vec2Model

            self._wav2vec2 = Wav2Vec2Model.from_pretrained(str(path), local_files_only=True).to(self.device)
        return self._wav2vec2.eval()

    # ------------------------------------------------------------------ content
    @torch.no_grad()
    def audio_features(self, waveform: torch.Tensor) -> torch.Tensor:
        """``(T,)`` 16 kHz waveform -> ``(N, audio_feature_dim)`` wav2vec2 frames (50 Hz)."""
        x = waveform.float().to(self.device)
        if self.config.normalize_audio:
            x = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-7)
        if x.shape[0] < _MIN_WAV2VEC2_SAMPLES:
            x = F.pad(x, (0, _MIN_WAV2VEC2_SAMPLES - x.shape[0]))
        features = self.wav2vec2(x[None]).last_hidden_state[0]
        if features.shape[-1] != self.config.audio_feature_dim:
            raise ValueError(
                f"wav2vec2 gives {features.shape[-1]}-d frames; the content encoder reads "
                f"{self.config.audio_feature_dim}-d (DreamTalkConfig.audio_feature_dim)"
            )
        return features

    @torch.no_grad()
    def encode_content(self, windows: torch.Tensor) -> torch.Tensor:
        """``(L, W, audio_feature_dim)`` audio windows -> ``(L, W, d_model)`` content."""
        return self.diffusion.net.content_encoder(windows[None].to(self.device))[0]

    def speech_content(self, speech: Waveform, num_frames: Optional[int] = None) -> torch.Tensor:
        """Content of ``speech``: ``(L, W, d_model)`` with ``L = num_frames`` (by default
        :meth:`frame_count`)."""
        num_frames = num_frames or self.frame_count(speech)
        wave = _resample(speech.samples, speech.sample_rate, self.config.audio_sample_rate)
        windows = audio_windows(self.audio_features(wave), num_frames, self.config.window)
        return self.encode_content(windows)

    def silence_content(self) -> torch.Tensor:
        """``(content_dim,)``: the content encoder's output on one second of silence,
        what a frame in a pause of the speech is given (computed once)."""
        if getattr(self, "_silence_content", None) is None:
            quiet = Waveform(torch.zeros(self.config.audio_sample_rate), self.config.audio_sample_rate)
            self._silence_content = self.speech_content(quiet, 1).reshape(-1).float().cpu()
        return self._silence_content

    def content_features(self, audio: Sequence[PathLike]) -> List[torch.Tensor]:
        """Gold C^v: ``(L, window_frames * d_model)`` float32 per recording, one row per
        25 fps frame (``L = round(duration * 25)``)."""
        from empatheia.media import load_audio

        rate = self.config.audio_sample_rate
        windows, lengths = [], []
        for path in audio:
            # wav2vec2 runs on each recording alone: padding a batch would change the
            # features of models whose front end normalises over time (group norm).
            wave = load_audio(path, rate)
            frames = max(1, round(wave.shape[0] / rate * self.fps))
            windows.append(audio_windows(self.audio_features(wave), frames, self.config.window))
            lengths.append(frames)
        if not windows:
            return []
        # The content encoder treats every window on its own: one batch for all of them.
        content = self.encode_content(torch.cat(windows)).flatten(1).float().cpu()
        return list(content.split(lengths))

    # ------------------------------------------------------------------ style
    @torch.no_grad()
    def style_code(self, coefficients: Sequence[torch.Tensor]) -> torch.Tensor:
        """``(F_i, coeff_dim)`` expression coefficients of each clip -> ``(N, d_model)``
        style codes. Each clip is cut to its first ``style_max_len`` frames, as the
        official inference does."""
        max_len = self.config.style_max_len
        clips = [torch.as_tensor(c, dtype=torch.float32)[:max_len] for c in coefficients]
        lengths = torch.tensor([len(c) for c in clips])
        batch = nn.utils.rnn.pad_sequence(clips, batch_first=True).to(self.device)
        pad_mask = torch.arange(batch.shape[1])[None] >= lengths[:, None]
        pad_mask = pad_mask.to(self.device) if pad_mask.any() else None
        return self.diffusion.net.style_encoder(batch, pad_mask)

    def style_features(self, video: Sequence[PathLike]) -> List[torch.Tensor]:
        """Gold S^v: the ``(d_model,)`` style code of each video, from its expression
        coefficients (see :mod:`empatheia.generators.dreamtalk.coefficients` for where they come
        from). Raises :class:`~empatheia.errors.DataError` naming a video without them."""
        coefficients = [self.read_coefficients(path) for path in video]
        if not coefficients:
            return []
        return list(self.style_code(coefficients).float().cpu())

    def read_coefficients(self, video: PathLike) -> np.ndarray:
        """``(F, coeff_dim)`` expression coefficients of a style video (or coefficient file)."""
        path = Path(video)
        if self.coefficient_reader is not None and not is_coefficient_file(path):
            array = self.coefficient_reader(path)
        else:
            path = find_coefficient_file(path)
            array = read_coefficient_array(path)
        return expression_coefficients(array, source=path, coeff_dim=self.config.coeff_dim)

    # ------------------------------------------------------------------ motion
    @torch.no_grad()
    def sample_coefficients(
        self,
        content: torch.Tensor,
        style: torch.Tensor,
        *,
        guidance_scale: Optional[float] = None,
        ddim_steps: Optional[int] = None,
        seed: Optional[int] = None,
    ) -> torch.Tensor:
        """DDIM-sample expression coefficients.

        Args:
            content: ``(B, L, W, d_model)`` content-encoder output.
            style: ``(B, d_model)`` ready style codes.
            guidance_scale, ddim_steps, seed: override the config's sampling settings.

        Returns:
            ``(B, L, coeff_dim)``.
        """
        generator = torch.Generator(device=self.device).manual_seed(self.config.seed if seed is None else seed)
        return self.diffusion.ddim_sample(
            content.to(self.device).float(),
            style.to(self.device).float(),
            steps=ddim_steps or self.config.ddim_steps,
            guidance_scale=self.config.guidance_scale if guidance_scale is None else guidance_scale,
            generator=generator,
        )

    # ------------------------------------------------------------------ frames
    def prepare_portrait(self, portrait: np.ndarray) -> torch.Tensor:
        """``(H, W, 3)`` uint8 RGB -> ``(1, 3, S, S)`` in ``[-1, 1]``: the centred square,
        resized to the renderer's size. The portrait should already be framed on the face
        (as the official ``--disable_img_crop`` input): no face detection happens here."""
        image = np.asarray(portrait)
        if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8:
            raise ValueError(f"portrait must be (H, W, 3) uint8 RGB, got {image.dtype} {image.shape}")
        h, w = image.shape[:2]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        x = torch.from_numpy(np.ascontiguousarray(image[top : top + side, left : left + side]))
        x = x.permute(2, 0, 1)[None].float().to(self.device) / 127.5 - 1
        size = self.config.image_size
        if side != size:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        return x.clamp(-1, 1)

    def pose_sequence(self, pose: Optional[torch.Tensor], num_frames: int) -> torch.Tensor:
        """``(num_frames, pose_dim)`` head pose: the neutral pose when ``pose`` is None;
        otherwise its first ``num_frames`` rows, the last row held when it is shorter
        (as the official demo does with a pose reference)."""
        if pose is None:
            return torch.tensor(self.config.neutral_pose, device=self.device).expand(num_frames, -1)
        pose = torch.as_tensor(pose, dtype=torch.float32, device=self.device)
        if pose.dim() != 2 or pose.shape[1] != self.config.pose_dim or pose.shape[0] == 0:
            raise ValueError(f"pose must be (frames, {self.config.pose_dim}), got {tuple(pose.shape)}")
        if pose.shape[0] >= num_frames:
            return pose[:num_frames]
        return torch.cat([pose, pose[-1:].expand(num_frames - pose.shape[0], -1)])

    @torch.no_grad()
    def render(self, portrait: np.ndarray, coefficients: torch.Tensor, pose: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(F, coeff_dim)`` coefficients -> ``(F, S, S, 3)`` uint8 frames of ``portrait``."""
        source = self.prepare_portrait(portrait)
        coefficients = coefficients.to(self.device).float()
        motion = torch.cat([coefficients, self.pose_sequence(pose, coefficients.shape[0])], dim=1)
        windows = motion_windows(motion, self.config.semantic_radius)  # (F, 73, 27)
        frames = [
            self.renderer(source.expand(chunk.shape[0], -1, -1, -1), chunk)
            for chunk in windows.split(self.config.render_batch_size)
        ]
        images = torch.cat(frames).clamp(-1, 1)
        return ((images + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()

    @torch.no_grad()
    def animate(
        self,
        speech: Waveform,
        content: Optional[torch.Tensor],
        style: torch.Tensor,
        portrait: np.ndarray,
        *,
        pose: Optional[torch.Tensor] = None,
        guidance_scale: Optional[float] = None,
        seed: Optional[int] = None,
    ) -> VideoFrames:
        """
        Args:
            speech: the spoken response; the video has ``frame_count(speech)`` frames.
            content: ``(Ls, window_frames * d_model)`` C^v, one row per speech content
                unit, spread over the frames by ``speech.alignment`` (frames in silence
                take :meth:`silence_content`); without an alignment a time series
                resampled to ``frame_count(speech)`` rows; or ``None`` to compute it from
                ``speech`` with wav2vec2.
            style: ``(d_model,)`` ready style code S^v.
            portrait: ``(H, W, 3)`` uint8 RGB face crop.
            pose: optional ``(P, 9)`` head pose per frame; neutral by default.
            guidance_scale, seed: override the config's sampling settings.

        Returns:
            ``(F, image_size, image_size, 3)`` uint8 frames at 25 fps.
        """
        config = self.config
        frames = self.frame_count(speech)
        if content is None:
            windows = self.speech_content(speech, frames)
        else:
            if content.dim() != 2 or content.shape[1] != config.content_dim:
                raise ValueError(f"content must be (units, {config.content_dim}), got {tuple(content.shape)}")
            if speech.alignment is not None:
                content, _ = expand_units(content.float().cpu(), speech, frames, self.fps, self.silence_content())
            else:
                content = resample_rows(content.float(), frames)
            windows = content.reshape(frames, config.window_frames, config.d_model)
        style = torch.as_tensor(style, dtype=torch.float32)
        if style.shape != (config.d_model,):
            raise ValueError(f"style must be ({config.d_model},), got {tuple(style.shape)}")
        coefficients = self.sample_coefficients(windows[None], style[None], guidance_scale=guidance_scale, seed=seed)[0]
        return VideoFrames(self.render(portrait, coefficients, pose), fps=self.fps)

    # ------------------------------------------------------------------ identity
    def _wav2vec2_identity(self) -> str:
        """Hash of the wav2vec2 weights: of the injected module's tensors, or of the files
        of ``config.wav2vec2``; computed once."""
        if self._wav2vec2_fingerprint is None:
            folder = Path(self.config.wav2vec2) if self.config.wav2vec2 else None
            injected = self._wav2vec2 is not None and not _loaded_from(self._wav2vec2, folder)
            if injected:
                self._wav2vec2_fingerprint = "state:" + _state_sha256(self._wav2vec2)[:16]
            elif folder is not None and folder.is_dir():
                self._wav2vec2_fingerprint = "sha256:" + _folder_sha256(folder)[:16]
            else:
                return "none"
        return self._wav2vec2_fingerprint


def _resample(samples: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    samples = torch.as_tensor(samples, dtype=torch.float32)
    if rate == target:
        return samples
    import torchaudio.functional

    return torchaudio.functional.resample(samples, int(rate), int(target))


def _loaded_from(model: nn.Module, folder: Optional[Path]) -> bool:
    """Whether a Hugging Face ``model`` was loaded from ``folder``."""
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return folder is not None and bool(name) and Path(name) == folder


def _state_sha256(module: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _folder_sha256(folder: Path) -> str:
    """Hash of the config and weight files of a Hugging Face model folder."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.name == "config.json" or path.suffix in (".safetensors", ".bin")):
            digest.update(path.name.encode())
            digest.update(file_digest(path).encode())
    return digest.hexdigest()


__all__ = ["DreamTalk"]
