"""Finding and cropping the face in a clip of video frames.

Utterance videos arrive as ``(F, H, W, 3)`` uint8 RGB frames. The video encoder should see
the speaker's head, not the room, so before :func:`empatheia.media.frames_to_clip_input`
resizes them, :class:`FaceCropper` cuts one square around the face out of every frame.

The face is found with OpenCV's packaged Haar frontal-face cascade, which needs no weights
to download; ``opencv-python-headless<5`` provides it (OpenCV 5 dropped ``CascadeClassifier``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Tuple, Union

import numpy as np
import torch

from .errors import DataError

Frames = Union[torch.Tensor, np.ndarray]
Box = Tuple[int, int, int]

CASCADE_FILE = "haarcascade_frontalface_default.xml"


class NoFaceError(DataError):
    """No face was found in a clip."""


def _load_cascade() -> Any:
    try:
        import cv2
    except ImportError as error:
        raise ImportError(
            "face cropping needs OpenCV's Haar cascades: pip install 'opencv-python-headless<5'"
        ) from error
    if not hasattr(cv2, "CascadeClassifier") or not hasattr(cv2, "data"):
        raise ImportError(
            f"OpenCV {getattr(cv2, '__version__', '?')} has no packaged CascadeClassifier "
            "(OpenCV 5 removed it); install 'opencv-python-headless<5'"
        )
    path = str(Path(cv2.data.haarcascades) / CASCADE_FILE)
    cascade = cv2.CascadeClassifier(path)
    if cascade.empty():
        raise ImportError(f"cannot load the face cascade {path}; reinstall 'opencv-python-headless<5'")
    return cascade


@dataclass
class FaceCropper:
    """Finds the speaker's face in a clip and crops one steady square around it.

    Detection runs on ``num_probes`` evenly spaced frames only: talking-head clips barely
    move, and one box for the whole clip keeps the crop from jittering, which would
    otherwise show up in the video features as motion that is not there.

    Args:
        margin: how much to enlarge the detected box, as a fraction of its side. The Haar
            box runs from the eyebrows to the mouth; ~0.3 brings in the forehead, chin and
            ears, as talking-head pipelines crop.
        min_face_fraction: smallest face side accepted, as a fraction of the shorter frame
            side; smaller detections are usually false hits in the background.
        scale_factor: step between the cascade's search scales (> 1); smaller is slower
            and finds more.
        min_neighbors: overlapping hits a detection needs to count; higher means fewer
            false faces.
        num_probes: frames, evenly spaced over the clip, that detection runs on.
        detect_size: frames whose shorter side is larger are downscaled to it before
            detection; the cascade's cost grows with the pixel count, not its accuracy.
    """

    margin: float = 0.3
    min_face_fraction: float = 0.1
    scale_factor: float = 1.1
    min_neighbors: int = 5
    num_probes: int = 5
    detect_size: int = 320
    _cascade: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if not 0 < self.min_face_fraction <= 1:
            raise ValueError(f"min_face_fraction must be in (0, 1], got {self.min_face_fraction}")
        if self.scale_factor <= 1:
            raise ValueError(f"scale_factor must be > 1, got {self.scale_factor}")
        if self.min_neighbors < 0:
            raise ValueError(f"min_neighbors must be >= 0, got {self.min_neighbors}")
        if self.num_probes < 1:
            raise ValueError(f"num_probes must be >= 1, got {self.num_probes}")
        if self.detect_size < 24:  # the cascade's own window is 24x24
            raise ValueError(f"detect_size must be >= 24, got {self.detect_size}")

    def __getstate__(self) -> dict:
        # A cv2 classifier does not pickle; DataLoader workers load their own.
        state = dict(self.__dict__)
        state["_cascade"] = None
        return state

    @property
    def cascade(self) -> Any:
        if self._cascade is None:
            self._cascade = _load_cascade()
        return self._cascade

    def box(self, frames: Frames, source: Union[None, str, Path] = None) -> Box:
        """``(F, H, W, 3)`` uint8 RGB frames -> ``(top, left, size)`` of one square crop,
        inside the frame, for the whole clip.

        Raises :class:`NoFaceError` when none of the probed frames has a face.
        """
        height, width = _check_frames(frames, source)
        count = frames.shape[0]
        probes = np.unique(np.linspace(0, count - 1, min(self.num_probes, count)).round().astype(int))
        # A probe without a face (eyes shut, head turned) is no reason to drop the clip.
        faces = [face for face in (self._largest_face(frames[int(i)]) for i in probes) if face is not None]
        if not faces:
            raise NoFaceError(f"no face found in {len(probes)} probed frame(s)", file=source, field="video")
        # The median ignores the odd frame where the cascade locks on to something else.
        centre_y, centre_x, side = np.median(np.asarray(faces, dtype=np.float64), axis=0)
        size = min(int(round(side * (1 + self.margin))), height, width)
        top = int(np.clip(round(centre_y - size / 2), 0, height - size))
        left = int(np.clip(round(centre_x - size / 2), 0, width - size))
        return top, left, size

    def crop(self, frames: Frames, source: Union[None, str, Path] = None) -> Frames:
        """``(F, H, W, 3)`` uint8 RGB -> ``(F, size, size, 3)`` uint8, the face of every frame.

        The result is a view of ``frames`` (same type and dtype). ``source``, the file the
        frames came from, is named in errors.
        """
        top, left, size = self.box(frames, source)
        return frames[:, top : top + size, left : left + size]

    def _largest_face(self, frame: Frames) -> Optional[Tuple[float, float, float]]:
        """One ``(H, W, 3)`` RGB frame -> (centre row, centre column, side) of its largest
        face in frame pixels, or None."""
        import cv2

        image = frame.cpu().numpy() if isinstance(frame, torch.Tensor) else np.asarray(frame)
        grey = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
        scale = min(1.0, self.detect_size / min(grey.shape))
        if scale < 1.0:
            shape = (max(1, round(grey.shape[1] * scale)), max(1, round(grey.shape[0] * scale)))
            grey = cv2.resize(grey, shape, interpolation=cv2.INTER_AREA)
        smallest = max(1, int(self.min_face_fraction * min(grey.shape)))
        found = self.cascade.detectMultiScale(
            grey, scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors, minSize=(smallest, smallest)
        )
        if len(found) == 0:
            return None
        # (n, 4) rows of x, y, w, h. Several hits are a face plus background false alarms,
        # and the speaker's face is the biggest.
        x, y, w, h = np.asarray(found, dtype=np.float64)[np.argmax(found[:, 2] * found[:, 3])]
        return (y + h / 2) / scale, (x + w / 2) / scale, max(w, h) / scale


def _check_frames(frames: Frames, source: Union[None, str, Path]) -> Tuple[int, int]:
    if not isinstance(frames, (torch.Tensor, np.ndarray)):
        raise DataError(f"video frames must be a tensor or array, got {type(frames).__name__}", source, field="video")
    shape = tuple(frames.shape)
    if len(shape) != 4 or shape[-1] != 3:
        raise DataError(f"video frames must be (F, H, W, 3) RGB, got shape {shape}", source, field="video")
    if frames.dtype != (torch.uint8 if isinstance(frames, torch.Tensor) else np.uint8):
        raise DataError(f"video frames must be uint8, got {frames.dtype}", source, field="video")
    if min(shape[:3]) == 0:
        raise DataError(f"video frames are empty, shape {shape}", source, field="video")
    return shape[1], shape[2]
