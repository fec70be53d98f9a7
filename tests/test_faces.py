"""Face detection and cropping on real talking-head clips and on made-up frames."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from empatheia.errors import DataError
from empatheia.faces import FaceCropper, NoFaceError
from empatheia.media import frames_to_clip_input, load_video_frames

from .conftest import shared_data

ACTORS = ["M030_front_happy_level3_001", "W009_front_sad_level3_001", "W011_front_angry_level3_001"]


def clip(name: str, num_frames: int = 8) -> torch.Tensor:
    """``(num_frames, 256, 256, 3)`` uint8 frames of a MEAD front-camera clip."""
    return load_video_frames(shared_data(f"media/mead_faces/video/{name}.mp4"), num_frames)


def small_face(frame: torch.Tensor, side: int) -> torch.Tensor:
    """``(H, W, 3)`` uint8 -> ``(side, side, 3)`` uint8, downscaled."""
    x = frame.permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8)


def canvas_with_face(face: torch.Tensor, top: int, left: int, height: int = 480, width: int = 640) -> torch.Tensor:
    """A flat grey ``(height, width, 3)`` frame with ``face`` pasted at (top, left)."""
    frame = torch.full((height, width, 3), 128, dtype=torch.uint8)
    frame[top : top + face.shape[0], left : left + face.shape[1]] = face
    return frame


def covers(box, row: float, col: float) -> bool:
    top, left, size = box
    return top <= row < top + size and left <= col < left + size


@pytest.fixture(scope="module")
def cropper() -> FaceCropper:
    return FaceCropper()


@pytest.mark.parametrize("name", ACTORS)
def test_box_on_real_clips_is_a_square_around_the_face(cropper, name):
    frames = clip(name)
    _, height, width, _ = frames.shape
    top, left, size = cropper.box(frames)
    assert all(isinstance(v, int) for v in (top, left, size))
    assert 0 <= top and top + size <= height and 0 <= left and left + size <= width
    assert 0.3 * min(height, width) <= size <= min(height, width)
    # Frontal portraits: the face is in the middle of the picture, left to right.
    assert abs(left + size / 2 - width / 2) < 0.1 * width
    assert abs(top + size / 2 - height / 2) < 0.25 * height


@pytest.mark.parametrize("name", ACTORS[:1])
def test_crop_is_one_slice_of_the_input(cropper, name):
    frames = clip(name)
    top, left, size = cropper.box(frames)
    face = cropper.crop(frames, source=f"{name}.mp4")
    assert face.shape == (frames.shape[0], size, size, 3) and face.dtype == torch.uint8
    assert torch.equal(face, frames[:, top : top + size, left : left + size])
    assert face.data_ptr() == frames[:, top:, left:].data_ptr()  # a view, not a copy

    as_array = cropper.crop(frames.numpy())
    assert isinstance(as_array, np.ndarray) and np.array_equal(as_array, face.numpy())

    pixels = frames_to_clip_input(face, 32, mean=[0.5] * 3, std=[0.5] * 3)
    assert pixels.shape == (frames.shape[0], 3, 32, 32)


def test_face_off_centre_in_a_larger_frame_is_followed(cropper):
    frames = clip(ACTORS[0], num_frames=4)
    top, left, side = 330, 20, 128
    video = torch.stack([canvas_with_face(small_face(f, side), top, left) for f in frames])
    box = cropper.box(video)
    assert covers(box, top + side / 2, left + side / 2)
    assert 0.5 * side <= box[2] <= 1.6 * side
    face = cropper.crop(video)
    assert face.shape == (4, box[2], box[2], 3)


def test_one_stray_frame_does_not_move_the_box(cropper):
    frames = clip(ACTORS[1], num_frames=5)
    side = 128
    here, there = (40, 40), (300, 480)
    video = torch.stack(
        [canvas_with_face(small_face(f, side), *(there if i == 2 else here)) for i, f in enumerate(frames)]
    )
    box = FaceCropper(num_probes=5).box(video)
    assert covers(box, here[0] + side / 2, here[1] + side / 2)
    assert not covers(box, there[0] + side / 2, there[1] + side / 2)


def test_frames_without_a_face_among_the_probes_are_ignored(cropper):
    frames = clip(ACTORS[2], num_frames=5)
    blank = torch.full_like(frames[0], 90)
    video = torch.stack([blank, frames[1], blank, frames[3], blank])
    top, left, size = FaceCropper(num_probes=5).box(video)
    assert abs(left + size / 2 - 128) < 26


def test_margin_too_large_for_the_frame_shrinks_to_the_shorter_side():
    frames = clip(ACTORS[0], num_frames=3)
    assert FaceCropper(margin=3.0).box(frames) == (0, 0, 256)
    wide = torch.cat([frames, frames[:, :, :64]], dim=2)  # (3, 256, 320, 3)
    top, left, size = FaceCropper(margin=3.0).box(wide)
    assert (top, size) == (0, 256) and 0 <= left <= 64


def _gradient_video() -> torch.Tensor:
    rows = torch.linspace(0, 1, 120)[:, None, None]
    cols = torch.linspace(0, 1, 160)[None, :, None]
    colour = torch.tensor([1.0, 0.6, 0.3])
    frames = [(255 * (0.6 * rows + 0.4 * cols) * colour * (0.8 + 0.05 * t)).clamp(0, 255) for t in range(6)]
    return torch.stack(frames).to(torch.uint8)


def _noise_video() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (6, 120, 160, 3), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("make", [_gradient_video, _noise_video], ids=["gradient", "noise"])
def test_no_face_raises_an_error_naming_the_file(cropper, make):
    video = make()
    with pytest.raises(NoFaceError) as caught:
        cropper.crop(video, source="/data/clips/dia7utt3.mp4")
    error = caught.value
    assert isinstance(error, DataError)
    assert "dia7utt3.mp4" in str(error) and "no face found in 5 probed frame" in str(error)
    assert error.file == "/data/clips/dia7utt3.mp4" and error.field == "video"


def test_short_clip_probes_every_frame_once(cropper):
    with pytest.raises(NoFaceError, match="in 2 probed frame"):
        cropper.box(_gradient_video()[:2])


@pytest.mark.parametrize(
    "frames, message",
    [
        (torch.zeros(64, 64, 3, dtype=torch.uint8), "must be \\(F, H, W, 3\\)"),
        (torch.zeros(2, 64, 64, 4, dtype=torch.uint8), "must be \\(F, H, W, 3\\)"),
        (torch.zeros(2, 3, 64, 64, dtype=torch.uint8), "must be \\(F, H, W, 3\\)"),
        (torch.zeros(2, 64, 64, 3, dtype=torch.float32), "must be uint8"),
        (np.zeros((2, 64, 64, 3), dtype=np.int64), "must be uint8"),
        (torch.zeros(0, 64, 64, 3, dtype=torch.uint8), "empty"),
        ([[[[0, 0, 0]]]], "tensor or array"),
    ],
    ids=["no-frame-axis", "four-channels", "channels-first", "float", "int64-array", "no-frames", "list"],
)
def test_bad_frames_are_rejected_clearly(cropper, frames, message):
    with pytest.raises(DataError, match=message) as caught:
        cropper.crop(frames, source="bad.mp4")
    assert not isinstance(caught.value, NoFaceError)
    assert str(caught.value).startswith("bad.mp4")


@pytest.mark.parametrize(
    "settings",
    [
        {"margin": -0.1},
        {"min_face_fraction": 0.0},
        {"min_face_fraction": 1.5},
        {"scale_factor": 1.0},
        {"min_neighbors": -1},
        {"num_probes": 0},
        {"detect_size": 10},
    ],
)
def test_bad_settings_are_rejected(settings):
    with pytest.raises(ValueError, match=next(iter(settings))):
        FaceCropper(**settings)


def test_cropper_pickles_for_dataloader_workers(cropper):
    frames = clip(ACTORS[0], num_frames=3)
    box = cropper.box(frames)  # loads the cascade, which cannot be pickled itself
    copy = pickle.loads(pickle.dumps(cropper))
    assert copy == cropper and copy.box(frames) == box
