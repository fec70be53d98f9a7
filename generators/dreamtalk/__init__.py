"""DreamTalk (Ma et al., 2023), the talking-head generator Empatheia drives.

An independent PyTorch implementation of the published architecture that loads the
official checkpoints (``denoising_network.pth``, ``renderer.pt``) strictly:

* :class:`DreamTalk`: the :class:`~empatheia.generators.base.TalkingHeadGenerator`
  (``animate``, ``content_features``, ``style_features``, ``fingerprint``);
* :class:`DreamTalkConfig`: sizes (the published ones by default, ``tiny()`` for tests),
  checkpoint and wav2vec2 paths, sampling settings;
* the parts: :class:`AudioContentEncoder`, :class:`StyleEncoder`,
  :class:`MotionDenoiser`, :class:`DiffusionNetwork` (schedule, null style, DDIM with
  classifier-free guidance) and :class:`FaceRenderer`;
* :mod:`empatheia.generators.dreamtalk.coefficients`: where style videos' expression coefficients
  are read from.
"""

from .checkpoints import CheckpointError
from .coefficients import read_pose
from .config import DreamTalkConfig
from .content_encoder import AudioContentEncoder, audio_windows
from .denoiser import DisentangledDecoder, MotionDenoiser
from .diffusion import DiffusionNetwork, VarianceSchedule
from .generator import DreamTalk
from .renderer import FaceRenderer
from .style_encoder import StyleEncoder

__all__ = [
    "AudioContentEncoder",
    "CheckpointError",
    "DiffusionNetwork",
    "DisentangledDecoder",
    "DreamTalk",
    "DreamTalkConfig",
    "FaceRenderer",
    "MotionDenoiser",
    "StyleEncoder",
    "VarianceSchedule",
    "audio_windows",
    "read_pose",
]
