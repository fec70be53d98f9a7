"""The drawn face of the offline talking head: its expression space, how it is drawn, and
how its geometry is read back from the pixels.

An expression is a point in a 9-parameter space (:data:`EXPRESSION_PARAMS`); each emotion is
a direction in it (:data:`EMOTION_DIRECTIONS`). :func:`draw_features` draws brows, eyes and
a mouth with an expression over a portrait in :data:`LAYOUT` (DreamTalk-like aligned 256 x
256 crops: a frontal face centred in a square, eyes at 47.5 % of the height, mouth at 69 %);
:func:`default_portrait` draws such a portrait from an avatar's profile and
:func:`fit_portrait` brings a photo to the layout. :func:`face_geometry` measures what
:func:`draw_features` drew (brow heights and slopes, eye openness, mouth outline and
opening, pupils), which :class:`~empatheia.generators.avatar_renderer.AvatarRenderer` maps
back to expression parameters and the style.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np

EMOTIONS = ("sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted")
EXPRESSION_PARAMS = (
    "brow_raise",  # both brows up (+) or down (-)
    "brow_tilt",  # inner ends up (+, sad/fear) or down (-, angry)
    "brow_asym",  # the image-right brow raised alone
    "eye_open",  # lids wider (+) or narrower (-) than neutral
    "mouth_curve",  # corners up (+) or down (-)
    "mouth_asym",  # the image-right corner raised alone (a smirk)
    "mouth_width",  # corners spread (+) or pulled in (-)
    "jaw_open",  # mouth open at rest, before speech opens it further
    "lip_raise",  # upper lip raised, showing the teeth (disgust)
)
EMOTION_DIRECTIONS = np.array(
    [
        # raise  tilt  asym   eye  curve  masym width  jaw  lip
        [0.15, 1.0, 0.0, -0.35, -0.9, 0.0, -0.15, 0.0, 0.0],  # sad
        [0.3, 0.0, 0.0, -0.3, 1.0, 0.0, 0.5, 0.1, 0.0],  # happy
        [-0.8, -1.0, 0.0, -0.2, -0.4, 0.0, -0.35, 0.0, 0.15],  # angry
        [0.7, 0.8, 0.0, 0.55, -0.35, 0.0, 0.35, 0.3, 0.0],  # fear
        [1.0, 0.0, 0.0, 0.6, 0.0, 0.0, -0.3, 0.7, 0.0],  # surprised
        [0.0, 0.0, 0.8, -0.2, 0.15, 1.0, 0.0, 0.0, 0.0],  # contempt
        [-0.45, -0.45, 0.0, -0.4, -0.45, 0.0, 0.0, 0.05, 1.0],  # disgusted
    ]
)
"""``(7, 9)``: each emotion's full-intensity change of the expression parameters (FACS-
inspired: sad raises the inner brows and drops the corners, angry lowers and knits the
brows, surprise lifts brows and lids and drops the jaw, contempt is one-sided...)."""

GAZE_TRAVEL = (0.026, 0.012)
"""Iris travel (x, y) at gaze 1, as fractions of the side."""


@dataclass(frozen=True)
class Layout:
    """Where the face's parts sit, as fractions of the (square) portrait's side."""

    head_centre: Tuple[float, float] = (0.5, 0.53)
    head_axes: Tuple[float, float] = (0.265, 0.345)
    eye_y: float = 0.475
    eye_dx: float = 0.108
    eye_rx: float = 0.052
    eye_ry: float = 0.026
    iris_r: float = 0.02
    brow_y: float = 0.39
    brow_inner: float = 0.04
    brow_outer: float = 0.17
    nose_y: float = 0.595
    mouth_y: float = 0.69
    mouth_rx: float = 0.08


LAYOUT = Layout()

BROW_COLOUR = (35, 25, 22)
SCLERA_COLOUR = (250, 250, 248)
LID_COLOUR = (40, 28, 26)
LIP_COLOUR = (172, 56, 70)
MOUTH_COLOUR = (52, 14, 24)
TEETH_COLOUR = (244, 244, 238)


# ---------------------------------------------------------------------- drawing
def _px(value: float, size: int) -> int:
    return int(round(value * size))


def _ellipse(image, centre, axes, colour, arc=(0, 360), thickness=-1) -> None:
    """An anti-aliased ellipse with ``centre`` and ``axes`` as fractions of the side."""
    import cv2

    s = image.shape[0]
    cv2.ellipse(
        image, (_px(centre[0], s), _px(centre[1], s)), (_px(axes[0], s), _px(axes[1], s)),
        0, arc[0], arc[1], colour, thickness, cv2.LINE_AA,
    )


def _mouth_curves(expression: np.ndarray, opening: float, roundness: float, size: int, layout: Layout):
    """Outline points ``(25, 2)`` float: upper outer, upper inner, lower inner, lower
    outer edges, left to right, and the teeth's lower edge."""
    e = dict(zip(EXPRESSION_PARAMS, expression))
    cx, my = 0.5 * size, layout.mouth_y * size
    half = layout.mouth_rx * size * (1.0 + 0.25 * e["mouth_width"]) * (1.0 - 0.2 * roundness)
    corner_left = my - 0.028 * size * e["mouth_curve"]
    corner_right = corner_left - 0.03 * size * e["mouth_asym"]
    u = np.linspace(-1.0, 1.0, 25)
    bump = 1.0 - u**2
    corners = corner_left + (corner_right - corner_left) * (u + 1.0) / 2.0
    middle = corners * u**2 + my * bump
    gap = 0.075 * size * float(np.clip(e["jaw_open"] + opening, 0.0, 1.2))
    shape = bump**0.7
    upper_inner = middle - 0.25 * gap * shape - 0.02 * size * max(e["lip_raise"], 0.0) * bump
    lower_inner = middle + 0.75 * gap * shape
    upper_outer = upper_inner - 0.014 * size * np.sqrt(bump)
    lower_outer = lower_inner + 0.02 * size * np.sqrt(bump)
    teeth = np.minimum(upper_inner + 0.018 * size * shape, lower_inner)
    x = cx + half * u
    return [np.stack([x, y], axis=1) for y in (upper_outer, upper_inner, lower_inner, lower_outer, teeth)]


def draw_features(
    image: np.ndarray,
    expression: np.ndarray,
    opening: float = 0.0,
    roundness: float = 0.0,
    blink: float = 1.0,
    iris_colour: Tuple[int, int, int] = (92, 62, 40),
    layout: Layout = LAYOUT,
    gaze: Tuple[float, float] = (0.0, 0.0),
) -> np.ndarray:
    """Draw brows, eyes and mouth with ``expression`` (``(9,)``) onto a copy of the
    ``(S, S, 3)`` uint8 RGB ``image``; ``blink`` scales the lid opening, ``gaze``
    ``(x, y)`` in [-1, 1] moves the irises by up to :data:`GAZE_TRAVEL`."""
    import cv2

    size = image.shape[0]
    out = image.copy()
    e = dict(zip(EXPRESSION_PARAMS, expression))
    # cv2 draws in fixed point with 4 fractional bits: sub-pixel outlines keep small
    # moves of the features smooth instead of jumping a pixel at a time.
    scale = float(1 << 4)

    def points(array: np.ndarray) -> np.ndarray:
        return np.round(array * scale).astype(np.int32).reshape(-1, 1, 2)

    # Brows: a tapered arc from the inner to the outer end.
    for side in (-1.0, 1.0):
        lift = 0.028 * e["brow_raise"] + (0.022 * e["brow_asym"] if side > 0 else 0.0)
        inner = layout.brow_y - lift - 0.022 * e["brow_tilt"]
        outer = layout.brow_y - lift + 0.01 * e["brow_tilt"]
        t = np.linspace(0.0, 1.0, 12)
        xs = 0.5 + side * (layout.brow_inner + (layout.brow_outer - layout.brow_inner) * t)
        ys = inner + (outer - inner) * t - 0.014 * np.sin(np.pi * t)
        thickness = 0.011 - 0.005 * t
        top = np.stack([xs, ys - thickness], axis=1) * size
        bottom = np.stack([xs, ys + thickness], axis=1)[::-1] * size
        cv2.fillPoly(out, [points(np.concatenate([top, bottom]))], BROW_COLOUR, cv2.LINE_AA, 4)

    # Eyes: sclera and iris inside the lid ellipse, then the upper lid line.
    openness = float(np.clip(1.0 + e["eye_open"], 0.05, 2.0)) * blink
    for side in (-1.0, 1.0):
        cx, cy = (0.5 + side * layout.eye_dx) * size, layout.eye_y * size
        rx, ry = layout.eye_rx * size, max(layout.eye_ry * size * openness, 0.5)
        x0, x1 = int(cx - rx) - 2, int(cx + rx) + 3
        y0, y1 = int(cy - layout.eye_ry * size * 2.2) - 2, int(cy + layout.eye_ry * size * 2.2) + 3
        roi = out[y0:y1, x0:x1]
        local = (int(round((cx - x0) * scale)), int(round((cy - y0) * scale)))
        axes = (int(round(rx * scale)), int(round(ry * scale)))
        mask = np.zeros(roi.shape[:2], np.uint8)
        cv2.ellipse(mask, local, axes, 0, 0, 360, 255, -1, cv2.LINE_AA, 4)
        eye = np.empty_like(roi)
        eye[:] = SCLERA_COLOUR
        iris = int(round(layout.iris_r * size * scale))
        looking = (
            local[0] + int(round(gaze[0] * GAZE_TRAVEL[0] * size * scale)),
            local[1] + int(round(gaze[1] * GAZE_TRAVEL[1] * size * scale)),
        )
        cv2.circle(eye, looking, iris, iris_colour, -1, cv2.LINE_AA, 4)
        cv2.circle(eye, looking, int(iris * 0.45), (18, 14, 14), -1, cv2.LINE_AA, 4)
        glint = (looking[0] + iris // 3, looking[1] - iris // 3)
        cv2.circle(eye, glint, max(int(iris * 0.18), 1), (255, 255, 255), -1, cv2.LINE_AA, 4)
        alpha = (mask.astype(np.float32) / 255.0)[..., None]
        roi[:] = (roi * (1.0 - alpha) + eye * alpha).astype(np.uint8)
        lid_centre = (int(round(cx * scale)), int(round(cy * scale)))
        cv2.ellipse(out, lid_centre, axes, 0, 180, 360, LID_COLOUR, 2, cv2.LINE_AA, 4)

    # Mouth: lips, the dark inside, the upper teeth, and a seam when closed.
    upper_outer, upper_inner, lower_inner, lower_outer, teeth = _mouth_curves(
        expression, opening, roundness, size, layout
    )
    lips = np.concatenate([upper_outer, lower_outer[::-1]])
    cv2.fillPoly(out, [points(lips)], LIP_COLOUR, cv2.LINE_AA, 4)
    if np.max(lower_inner[:, 1] - upper_inner[:, 1]) > 0.6:
        inside = np.concatenate([upper_inner, lower_inner[::-1]])
        cv2.fillPoly(out, [points(inside)], MOUTH_COLOUR, cv2.LINE_AA, 4)
        middle = slice(5, 20)
        cv2.fillPoly(
            out, [points(np.concatenate([upper_inner[middle], teeth[middle][::-1]]))], TEETH_COLOUR, cv2.LINE_AA, 4
        )
    cv2.polylines(out, [points(upper_inner)], False, (96, 30, 40), 1, cv2.LINE_AA, 4)
    return out


def feature_mask(size: int, layout: Layout) -> np.ndarray:
    """``(S, S)`` uint8 mask of where the renderer draws (eyes, brows, mouth), grown a
    little, for painting the portrait's own features out."""
    mask = np.zeros((size, size), np.uint8)
    for side in (-1.0, 1.0):
        cx = 0.5 + side * layout.eye_dx
        _ellipse(mask, (cx, layout.eye_y), (layout.eye_rx * 1.35, 0.05), 255)
        bx = 0.5 + side * (layout.brow_inner + layout.brow_outer) / 2
        _ellipse(mask, (bx, layout.brow_y - 0.01), (0.085, 0.045), 255)
    _ellipse(mask, (0.5, layout.mouth_y + 0.02), (layout.mouth_rx * 1.6, 0.075), 255)
    return mask


def square_crop(image: np.ndarray, size: int) -> np.ndarray:
    """Centre-crop to a square and resize to ``size`` (uint8 RGB)."""
    import cv2

    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"portrait must be (H, W, 3) RGB, got shape {image.shape}")
    image = image.astype(np.uint8) if image.dtype != np.uint8 else image
    h, w = image.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    crop = np.ascontiguousarray(image[top : top + side, left : left + side])
    if side == size:
        return crop.copy()
    interpolation = cv2.INTER_AREA if side > size else cv2.INTER_CUBIC
    return cv2.resize(crop, (size, size), interpolation=interpolation)


# ---------------------------------------------------------------------- portraits
_SKIN = [(241, 212, 190), (228, 188, 160), (205, 160, 124), (174, 124, 90), (134, 90, 62), (100, 66, 46)]
_HAIR = [(30, 24, 22), (70, 45, 30), (120, 80, 45), (170, 120, 60), (200, 170, 110), (110, 40, 25)]
_IRIS = [(92, 62, 40), (60, 90, 120), (70, 100, 60), (50, 36, 28)]


def _label(value) -> str:
    return "".join(ch for ch in str(value or "").lower() if ch.isalnum())


def default_portrait(profile: dict, seed: int, size: int = 256) -> np.ndarray:
    """A stylised frontal portrait in :data:`LAYOUT` for an avatar without a picture:
    ``(size, size, 3)`` uint8 RGB, the same for the same ``profile`` and ``seed``.

    The profile shapes it: ``gender`` (long or short hair, face width), ``age`` (child:
    rounder face, elderly: grey hair and lines), ``timbre`` (a lower voice gets a
    broader jaw); the seed picks skin, hair and eye colours and the background.
    """
    import cv2

    rng = np.random.default_rng(seed)
    gender, age = _label((profile or {}).get("gender")), _label((profile or {}).get("age"))
    timbre = _label((profile or {}).get("timbre"))
    skin = np.array(_SKIN[rng.integers(len(_SKIN))], dtype=np.float64)
    hair = _HAIR[rng.integers(len(_HAIR))]
    if age == "elderly":
        hair = (190, 188, 184) if rng.random() < 0.6 else (150, 148, 146)
    s = size
    # Background: a soft vertical gradient between two seeded pastel colours.
    top_colour, bottom_colour = rng.uniform(150, 235, size=3), rng.uniform(110, 215, size=3)
    t = np.linspace(0.0, 1.0, s)[:, None, None]
    image = np.broadcast_to(top_colour * (1 - t) + bottom_colour * t, (s, s, 3)).astype(np.uint8).copy()

    head_cx, head_cy = LAYOUT.head_centre
    ax, ay = LAYOUT.head_axes
    if gender == "female":
        ax *= 0.96
    if age == "child":
        ax, ay = ax * 1.05, ay * 0.97
    if timbre == "low":
        ax *= 1.03
    skin_c = tuple(int(v) for v in skin)
    shade = tuple(int(v) for v in skin * 0.82)
    shirt = tuple(int(v) for v in rng.uniform(40, 200, size=3))

    # Long hair falls behind the head and onto the shoulders.
    if gender == "female":
        _ellipse(image, (0.5, 0.56), (ax + 0.06, 0.4), hair)
        corners = (_px(0.5 - ax - 0.06, s), _px(0.56, s)), (_px(0.5 + ax + 0.06, s), _px(0.92, s))
        cv2.rectangle(image, *corners, hair, -1)
    # Shoulders and neck.
    _ellipse(image, (0.5, 1.08), (0.46, 0.2), shirt)
    cv2.rectangle(image, (_px(0.415, s), _px(0.78, s)), (_px(0.585, s), _px(0.93, s)), shade, -1)
    # Ears, then the head.
    for side in (-1, 1):
        _ellipse(image, (0.5 + side * ax, LAYOUT.eye_y + 0.04), (0.03, 0.055), shade)
    _ellipse(image, (head_cx, head_cy), (ax, ay), skin_c)
    # Hair on top of the head down to a hairline that stays above 26 % of the height
    # over the brows (so that they stay clear) and comes down at the temples.
    ys, xs = np.mgrid[0:s, 0:s] / float(s)
    dx = np.abs(xs - 0.5)
    inside = ((xs - 0.5) / (ax + 0.02)) ** 2 + ((ys - head_cy) / (ay + 0.045)) ** 2 <= 1.0
    receding = 0.03 if age == "elderly" and gender == "male" else 0.0
    hairline = 0.255 + 1.6 * np.maximum(dx - 0.19, 0.0) + receding
    hair_mask = (inside & (ys < hairline)).astype(np.float32)
    hair_mask = cv2.GaussianBlur(hair_mask, (3, 3), 0)[..., None]
    image[:] = (image * (1.0 - hair_mask) + np.asarray(hair, np.float32) * hair_mask).astype(np.uint8)
    if gender == "female":
        for side in (-1, 1):
            _ellipse(image, (0.5 + side * (ax - 0.012), 0.36), (0.03, 0.13), hair)
    # Nose: a soft shadow and the nostrils.
    nose = LAYOUT.nose_y
    bridge = ((_px(0.49, s), _px(LAYOUT.eye_y + 0.02, s)), (_px(0.484, s), _px(nose - 0.015, s)))
    cv2.line(image, *bridge, shade, 2, cv2.LINE_AA)
    for side in (-1, 1):
        _ellipse(image, (0.5 + side * 0.02, nose), (0.014, 0.008), shade)
    # Lines for the elderly, faint enough not to read as a brow or a lip.
    faint = tuple(int(v) for v in skin * 0.9)
    if age == "elderly":
        for dy in (0.27, 0.295):
            _ellipse(image, (0.5, dy + 0.03), (0.09, 0.03), faint, arc=(200, 340), thickness=1)
        for side in (-1, 1):
            arc = (90 - side * 60, 90 - side * 20)
            _ellipse(image, (0.5 + side * 0.12, 0.66), (0.03, 0.06), faint, arc=arc, thickness=1)
    iris = _IRIS[rng.integers(len(_IRIS))]
    return draw_features(image, np.zeros(len(EXPRESSION_PARAMS)), iris_colour=iris)


def fit_portrait(image: np.ndarray, size: int = 256) -> np.ndarray:
    """Crop a photo to :data:`LAYOUT` (a square around the face found by the Haar
    detector of :class:`empatheia.faces.FaceCropper`) and resize to ``size``; an image
    without a detectable face is centre-cropped."""
    from empatheia.faces import FaceCropper, NoFaceError

    frames = np.asarray(image, dtype=np.uint8)[None]
    try:
        top, left, side = FaceCropper(margin=0.45, num_probes=1).box(frames)
        frames = frames[:, top : top + side, left : left + side]
    except NoFaceError:
        pass
    return square_crop(frames[0], size)


# ---------------------------------------------------------------------- measuring
def _windows(size: int, layout: Layout) -> Dict[str, Tuple[slice, slice]]:
    def box(x0, x1, y0, y1):
        return slice(_px(y0, size), _px(y1, size)), slice(_px(x0, size), _px(x1, size))

    windows = {"mouth": box(0.36, 0.64, 0.605, 0.80), "cheeks": box(0.32, 0.38, 0.55, 0.60)}
    for name, side in (("left", -1), ("right", 1)):
        # Inside the hairline (26 % of the height, lower beyond 19 % from the middle).
        inner, outer = 0.5 + side * 0.035, 0.5 + side * 0.185
        windows[f"brow_{name}"] = box(min(inner, outer), max(inner, outer), 0.29, 0.44)
        cx = 0.5 + side * layout.eye_dx
        windows[f"eye_{name}"] = box(cx - 0.048, cx + 0.048, layout.eye_y - 0.06, layout.eye_y + 0.06)
        windows[f"pupil_{name}"] = box(cx - layout.eye_rx, cx + layout.eye_rx, layout.eye_y - 0.025, layout.eye_y + 0.03)
    return windows


GEOMETRY_COLUMNS = (
    "brow_left_height",
    "brow_left_slope",
    "brow_right_height",
    "brow_right_slope",
    "eye_left_open",
    "eye_right_open",
    "mouth_width",
    "mouth_top",
    "mouth_top_slope",
    "mouth_top_curvature",
    "mouth_bottom",
    "mouth_dark_area",
    "mouth_teeth_area",
    "mouth_middle",
    "pupil_dx",
    "pupil_dy",
)
"""The columns of :func:`face_geometry`."""


def face_geometry(frames: np.ndarray, layout: Layout = LAYOUT) -> np.ndarray:
    """``(F, S, S, 3)`` uint8 RGB frames of this renderer -> ``(F, 16)`` geometry per frame
    (:data:`GEOMETRY_COLUMNS`; lengths as fractions of the side, areas in % of the
    frame): per brow its height at the window centre and its slope (inner end up is
    positive); per eye the mean sclera height; the mouth's width, the height, slope and
    curvature of its top edge, the height of its bottom edge, its dark (open) area, its
    teeth area and the height of its mid-line; and where the pupils are (the centroid of
    the near-black pixels in each eye's opening, from the eye's centre in the layout,
    mean of both eyes; 0 when the eyes are shut), which follows the gaze."""
    f, size = frames.shape[0], frames.shape[1]
    x = frames.astype(np.float32)
    luma = x @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # (F, S, S)
    w = _windows(size, layout)
    cheeks = x[:, w["cheeks"][0], w["cheeks"][1]].reshape(f, -1, 3)
    skin = np.median(cheeks, axis=1)  # (F, 3)
    skin_luma = skin @ np.array([0.299, 0.587, 0.114])
    channel_min, channel_max = x.min(axis=-1), x.max(axis=-1)
    white = (channel_min > 185) & (channel_max - channel_min < 32)
    out = []

    for name in ("left", "right"):
        rows, cols = w[f"brow_{name}"]
        dark = luma[:, rows, cols] < (0.55 * skin_luma)[:, None, None]  # (F, h, w)
        ys = np.arange(dark.shape[1], dtype=np.float64)[None, :, None]
        counts = dark.sum(axis=1)  # (F, w)
        centre = (dark * ys).sum(axis=1) / np.maximum(counts, 1)  # (F, w) row of the brow
        # A brow is at least 2 px thick; a lone dark pixel is a stray hair or a speck.
        valid = counts >= 2
        xs = np.arange(dark.shape[2], dtype=np.float64)[None, :] - (dark.shape[2] - 1) / 2.0
        n = np.maximum(valid.sum(axis=1), 1)
        mean_x = (valid * xs).sum(axis=1) / n
        mean_y = (valid * centre).sum(axis=1) / n
        var_x = (valid * (xs - mean_x[:, None]) ** 2).sum(axis=1)
        cov = (valid * (xs - mean_x[:, None]) * (centre - mean_y[:, None])).sum(axis=1)
        slope = cov / np.maximum(var_x, 1e-6)
        height = mean_y - slope * mean_x + rows.start  # at the window's centre column
        # Slope as inner-end-higher positive on both sides.
        out += [height / size, (slope if name == "left" else -slope)]
    pupil_offsets = []
    for name, side in (("left", -1.0), ("right", 1.0)):
        rows, cols = w[f"eye_{name}"]
        out.append(white[:, rows, cols].sum(axis=(1, 2)) / (cols.stop - cols.start) / size)
        # The pupil is darker than everything near it (the lid line and the brows stop
        # at a channel maximum of 35-40); its window stops short of the lowest brow.
        rows, cols = w[f"pupil_{name}"]
        darkness = np.clip((32.0 - channel_max[:, rows, cols]) / 10.0, 0.0, 1.0)  # (F, h, w)
        mass = darkness.sum(axis=(1, 2))
        ys = np.arange(rows.start, rows.stop, dtype=np.float64) - layout.eye_y * size
        xs = np.arange(cols.start, cols.stop, dtype=np.float64) - (0.5 + side * layout.eye_dx) * size
        found = mass > 1.0
        centroid = np.stack([darkness.sum(axis=1) @ xs, darkness.sum(axis=2) @ ys], axis=1)
        pupil_offsets.append(np.where(found[:, None], centroid / np.maximum(mass, 1e-9)[:, None], 0.0) / size)
    pupil = (pupil_offsets[0] + pupil_offsets[1]) / 2.0  # (F, 2)

    rows, cols = w["mouth"]
    region = x[:, rows, cols]
    # Lips by their redness (red over green), which no skin tone reaches, the inside by
    # its darkness, the teeth by their whiteness: all independent of the skin's shade.
    lips = region[..., 0] > 1.9 * region[..., 1] + 8.0
    dark = luma[:, rows, cols] < np.minimum(70.0, 0.6 * skin_luma)[:, None, None]
    teeth = white[:, rows, cols]
    mouth = lips | dark | teeth  # (F, h, w)
    h, wd = mouth.shape[1], mouth.shape[2]
    column_any = mouth.any(axis=1)  # (F, w)
    top = np.where(column_any, mouth.argmax(axis=1), np.nan)
    bottom = np.where(column_any, h - 1 - mouth[:, ::-1, :].argmax(axis=1), np.nan)
    columns = np.arange(wd, dtype=np.float64)
    left = np.where(column_any.any(axis=1), column_any.argmax(axis=1), 0)
    right = np.where(column_any.any(axis=1), wd - 1 - column_any[:, ::-1].argmax(axis=1), 1)
    width = (right - left + 1).astype(np.float64)
    centre = (left + right) / 2.0
    u = (columns[None, :] - centre[:, None]) / np.maximum(width[:, None] / 2.0, 1.0)  # (F, w)
    fit = np.zeros((f, 3))
    for i in range(f):  # a 3-coefficient fit per frame; vectorising it obscures more than it saves
        ok = column_any[i] & (np.abs(u[i]) <= 0.9)
        if ok.sum() >= 3:
            fit[i] = np.polyfit(u[i][ok], top[i][ok], 2)[::-1]
    mid_rows = np.where(column_any, (top + bottom) / 2.0, np.nan)
    centre_cols = np.abs(u) < 0.3
    centre_rows = np.where(centre_cols & column_any, mid_rows, 0.0)
    mid = centre_rows.sum(axis=1) / np.maximum((centre_cols & column_any).sum(axis=1), 1)
    out += [
        width / size,
        (fit[:, 0] + rows.start) / size,
        fit[:, 1] / size,
        fit[:, 2] / size,
        (np.nanmax(np.where(column_any, bottom, 0.0), axis=1) + rows.start) / size,
        dark.sum(axis=(1, 2)) / size**2 * 100.0,
        teeth.sum(axis=(1, 2)) / size**2 * 100.0,
        (mid + rows.start) / size,
        pupil[:, 0],
        pupil[:, 1],
    ]
    return np.stack(out, axis=1)
