"""Where the face-model coefficients of a style video come from.

DreamTalk's style encoder reads the 64 expression coefficients per frame that a 3D face
reconstruction (Deep3DFaceRecon, as PIRenderer extracts them) fits to a 25 fps video.
Those reconstruction weights are not available offline, so :class:`DreamTalk` reads the
coefficients instead of computing them. The contract:

1. A path that *is* a coefficient file (``.npy``, ``.mat``, ``.txt``) is read directly.
2. Otherwise, if a ``coefficient_reader`` callable was given to :class:`DreamTalk`, it is
   called with the video path and returns the coefficients.
3. Otherwise the coefficients are read from a file next to the video with the same stem,
   the first that exists of ``clip.coeffs.npy``, ``clip.mat``, ``clip.txt`` for
   ``clip.mp4``; with none, a :class:`~empatheia.errors.DataError` names the video and
   the files looked for.

Accepted layouts, one row per video frame (25 fps):

* ``(F, 64)``: expression coefficients;
* ``(F, 73)``: DreamTalk's own output (expression followed by 9 pose values);
* ``(F, 257)``: full Deep3DFaceRecon coefficients (identity 0:80, expression 80:144,
  texture 144:224, angles 224:227, lighting 227:254, translation 254:257);
* ``.mat`` files as PIRenderer/DreamTalk store them: ``coeff`` ``(F, 257)`` (and
  ``transform_params`` ``(F, 5)``). Reading them needs SciPy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

from empatheia.errors import DataError

PathLike = Union[str, Path]
CoefficientReader = Callable[[Path], Union[np.ndarray, torch.Tensor]]
"""Video path -> ``(F, 64 | 73 | 257)`` coefficients of its frames."""

COEFFICIENT_SUFFIXES = (".npy", ".mat", ".txt")
SIDECAR_NAMES = ("{stem}.coeffs.npy", "{stem}.mat", "{stem}.txt")
EXPRESSION = slice(80, 144)
"""Expression columns of the 257-d Deep3DFaceRecon coefficients."""
ANGLES, TRANSLATION = slice(224, 227), slice(254, 257)


def is_coefficient_file(path: PathLike) -> bool:
    return Path(path).suffix.lower() in COEFFICIENT_SUFFIXES


def sidecar_candidates(video: PathLike) -> Sequence[Path]:
    video = Path(video)
    stem = video.name[: -len(video.suffix)] if video.suffix else video.name
    return [video.with_name(name.format(stem=stem)) for name in SIDECAR_NAMES]


def find_coefficient_file(video: PathLike) -> Path:
    """The coefficient file of ``video`` (itself, or the first sidecar that exists)."""
    video = Path(video)
    if is_coefficient_file(video):
        if not video.is_file():
            raise DataError("coefficient file not found", file=video, field="video")
        return video
    candidates = sidecar_candidates(video)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    names = ", ".join(c.name for c in candidates)
    raise DataError(
        "no 3DMM expression coefficients for this video: DreamTalk's style encoder reads "
        f"them from a file next to it ({names}) or from a coefficient_reader given to DreamTalk",
        file=video,
        field="video",
    )


def read_coefficient_array(path: PathLike) -> np.ndarray:
    """The raw 2-D array of a ``.npy``, ``.txt`` or ``.mat`` (its ``coeff``) file."""
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            array = np.load(path, allow_pickle=False)
        elif suffix == ".txt":
            array = np.loadtxt(path, ndmin=2)
        elif suffix == ".mat":
            array = _read_mat(path)["coeff"]
        else:
            raise DataError(f"unknown coefficient file type {suffix!r}", file=path, field="video")
    except DataError:
        raise
    except Exception as error:
        raise DataError(f"cannot read coefficients: {error}", file=path, field="video") from None
    return np.asarray(array)


def expression_coefficients(array, source: Optional[PathLike] = None, coeff_dim: int = 64) -> np.ndarray:
    """``(F, 64 | 73 | 257)`` -> ``(F, 64)`` float32 expression coefficients."""
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    array = np.asarray(array, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] == 0:
        raise DataError(f"coefficients must be (frames, dims) with frames > 0, got shape {array.shape}", file=source, field="video")
    width = array.shape[1]
    if width == coeff_dim or width == coeff_dim + 9:
        exp = array[:, :coeff_dim]
    elif width == 257 and coeff_dim == 64:
        exp = array[:, EXPRESSION]
    else:
        raise DataError(
            f"coefficients have {width} columns; expected {coeff_dim} (expression), {coeff_dim + 9} "
            "(expression + pose) or 257 (Deep3DFaceRecon)",
            file=source,
            field="video",
        )
    if not np.isfinite(exp).all():
        raise DataError("coefficients contain NaN or infinite values", file=source, field="video")
    return np.ascontiguousarray(exp)


def read_pose(path: PathLike) -> np.ndarray:
    """``(F, 9)`` pose (angles, translation, crop) of a pose reference, as the official
    demo reads it: from a ``.mat`` (``coeff`` angles and translation, the last three
    ``transform_params``) or a ``.npy`` of shape ``(F, 9)`` or ``(F, 73)``."""
    path = Path(path)
    if path.suffix.lower() == ".mat":
        data = _read_mat(path)
        coeff, transform = np.asarray(data["coeff"]), np.asarray(data["transform_params"])
        pose = np.concatenate([coeff[:, ANGLES], coeff[:, TRANSLATION], transform[:, -3:]], axis=1)
    else:
        pose = np.load(path, allow_pickle=False)
        pose = pose[:, -9:] if pose.ndim == 2 and pose.shape[1] == 73 else pose
    if pose.ndim != 2 or pose.shape[1] != 9:
        raise DataError(f"pose must be (frames, 9), got shape {pose.shape}", file=path)
    return pose.astype(np.float32)


def _read_mat(path: Path) -> dict:
    try:
        from scipy.io import loadmat
    except ImportError:
        raise DataError("reading .mat coefficient files needs SciPy (pip install scipy); or save them as .npy", file=path) from None
    return loadmat(str(path))
