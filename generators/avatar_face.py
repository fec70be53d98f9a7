"""The drawn face of the offline talking head: its expression space, how it is drawn, and
how its geometry is read back from the pixels.

An expression is a point in a 9-parameter space (:data:`EXPRESSION_PARAMS`); each emotion is
a direction in it (:data:`EMOTION_DIRECTIONS`). :func:`draw_features` draws brows, eyes and
a mouth with an expression over a portrait in :data:`LAYOUT` (DreamTalk-like aligned 256 x
256 crops: a frontal face centred in a square, eyes at 47.5 % of the height, mouth at 69 %),
with the skin's folds and shadows that the expression's muscles make;
:func:`default_portrait` draws such a portrait from an avatar's profile and
:func:`fit_portrait` brings a photo to the layout. :func:`face_geometry` measures what
:func:`draw_features` drew (brow heights and slopes, eye openness, mouth outline and
opening, pupils), which :class:`~empatheia.generators.avatar_renderer.AvatarRenderer` maps
back to expression parameters and the style.

The faces are drawn to be read by a facial-expression reader trained on photographs
(FER2013's 48 x 48 grey face crops; ``python bench/face_legibility.py`` counts how often the
FER network of ``empatheia eval`` names the emotion drawn): what such a reader keys on is
drawn in grey-level contrast, not only in colour or outline. The emotions follow the Facial
Action Coding System: happy is a broad smile that bares the upper teeth with raised cheeks
(AU6+12+25), sad raises the inner brows and pulls the corners down (AU1+4+15), angry
lowers and knits the brows over narrowed eyes, the upper lip drawn up a little (AU4+7+10),
fear raises the inner brows over wide-open eyes with the upper lip raised and the corners
pulled down (AU1+2+5+10+15), surprise lifts brows and lids and drops the jaw into an O
(AU1+2+5+26), disgust lowers the brows, wrinkles the nose and raises the upper lip
(AU4+9+10), contempt is a one-sided smirk (AU14). A portrait's background is kept well apart from its skin in grey level, so that
the face stands out as a face does in a photograph (the Haar detector that crops faces for
the reader finds it by that contrast).

The mouth has two owners: the expression sets the lips' shape (corners, width, the raised
upper lip) and the jaw's rest opening; speech opens the jaw further from that rest
(:func:`jaw_opening`), and silence closes it back to the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

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
    "lip_raise",  # upper lip raised, showing the teeth, nose wrinkled (disgust)
)
EMOTION_DIRECTIONS = np.array(
    [
        # raise  tilt  asym   eye  curve  masym width  jaw  lip
        [-0.1, 0.55, 0.0, -0.4, -0.9, 0.0, -0.1, 0.08, 0.1],  # sad
        [0.05, 0.0, 0.0, -0.1, 1.0, 0.0, 0.85, 0.2, 0.1],  # happy
        [-0.9, -1.0, 0.0, -0.3, -0.5, 0.0, -0.3, 0.1, 0.25],  # angry
        [0.4, 0.85, 0.0, 0.75, -0.7, 0.0, 0.05, 0.05, 0.35],  # fear
        [1.0, 0.0, 0.0, 0.45, 0.0, 0.0, -0.45, 0.3, 0.0],  # surprised
        [0.0, 0.0, 0.8, -0.2, 0.15, 1.0, 0.0, 0.0, 0.0],  # contempt
        [-0.5, -0.6, 0.0, -0.55, -0.55, 0.0, 0.45, 0.25, 1.0],  # disgusted
    ]
)
"""``(7, 9)``: each emotion's full-intensity change of the expression parameters (the
action units of the module docstring). The rest opening of the jaw stays at or under 0.3,
so that speech keeps most of the jaw's travel in every expression (:func:`jaw_opening`)."""

GAZE_TRAVEL = (0.026, 0.012)
"""Iris travel (x, y) at gaze 1, as fractions of the side."""


@dataclass(frozen=True)
class Layout:
    """Where the face's parts sit, as fractions of the (square) portrait's side."""

    head_centre: Tuple[float, float] = (0.5, 0.53)
    head_axes: Tuple[float, float] = (0.265, 0.345)
    eye_y: float = 0.475
    eye_dx: float = 0.1
    eye_rx: float = 0.046
    eye_ry: float = 0.0175
    iris_r: float = 0.021
    brow_y: float = 0.405
    brow_inner: float = 0.04
    brow_outer: float = 0.17
    nose_y: float = 0.595
    mouth_y: float = 0.69
    mouth_rx: float = 0.08


LAYOUT = Layout()

BROW_COLOUR = (35, 25, 22)
SCLERA_COLOUR = (236, 233, 228)
LID_COLOUR = (40, 28, 26)
LIP_TINT = (0.78, 0.36, 0.42)
"""Lips are the skin's colour times this: darker and redder than the skin whatever its tone
(a fixed red would vanish into a dark skin in grey)."""
MOUTH_COLOUR = (52, 14, 24)
TEETH_COLOUR = (244, 244, 238)
LUMA = np.array([0.299, 0.587, 0.114])
"""ITU-R BT.601 grey-level weights of R, G, B."""
JAW_GAP = 0.075
"""Lip parting at a jaw opening of 1, as a fraction of the side."""


def jaw_opening(rest: float, speech: float) -> float:
    """How far the jaw is open, 0 (shut) to 1: the expression's ``rest`` opening (its
    ``jaw_open``, clipped to [0, 1]) plus the ``speech`` opening in [0, 1] over what is left
    of the travel. The speech's share of the travel is the same shape in every expression,
    and the mouth never opens past the neutral face's widest, so that it stays inside the
    lower face (where lip-sync measures look for it) however open the expression is."""
    rest = float(np.clip(rest, 0.0, 1.0))
    return rest + (1.0 - rest) * float(np.clip(speech, 0.0, 1.0))


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


def _fixed(array: np.ndarray) -> np.ndarray:
    """Pixel points ``(n, 2)`` -> the ``(n, 1, 2)`` int32 that cv2 draws with 4 fractional
    bits: sub-pixel outlines keep small moves of the features smooth instead of jumping a
    pixel at a time."""
    return np.round(np.asarray(array) * 16.0).astype(np.int32).reshape(-1, 1, 2)


def _blend(image: np.ndarray, corner: Tuple[int, int], weight: np.ndarray, darken: bool) -> None:
    """Move the ``weight.shape`` block of ``image`` at ``corner`` (row, column) towards
    black (``darken``) or white by ``weight`` ``(h, w)`` in [0, 1]: a shadow scales the
    skin, so its hue stays."""
    (y0, x0), (h, w) = corner, weight.shape
    roi = image[y0 : y0 + h, x0 : x0 + w].astype(np.float32)
    target = 0.0 if darken else 255.0
    image[y0 : y0 + h, x0 : x0 + w] = np.round(roi + (target - roi) * weight[..., None]).astype(np.uint8)


def _tone(image: np.ndarray, centre, axes, strength: float) -> None:
    """Shade ``image`` in place under a soft ellipse (``centre``, ``axes`` as fractions of
    the side): ``strength < 0`` darkens (a shadow, by that share at the centre), ``> 0``
    lightens towards white (a highlight); both fade out over the ellipse."""
    if abs(strength) < 1e-3:
        return
    s = image.shape[0]
    cx, cy, ax, ay = (v * s for v in (*centre, *axes))
    reach = max(ax, ay) * 1.6
    x0, x1 = max(int(cx - reach), 0), min(int(cx + reach) + 1, s)
    y0, y1 = max(int(cy - reach), 0), min(int(cy + reach) + 1, s)
    if x1 <= x0 or y1 <= y0:
        return
    ys, xs = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    u, v = (xs - cx) / ax, (ys - cy) / ay
    _blend(image, (y0, x0), np.exp(-2.0 * (u**2 + v**2)) * abs(strength), strength < 0)


def _crease(image: np.ndarray, lines: Sequence[np.ndarray], strength: float, width: float = 1.5) -> None:
    """Darken ``image`` in place along soft lines (each ``(n, 2)`` points in pixels) by up
    to ``strength``: a skin fold or wrinkle, which the skin's own colour shows through."""
    import cv2

    if strength < 1e-3 or not lines:
        return
    every = np.concatenate(lines)
    pad = int(np.ceil(2 * width)) + 2
    x0, y0 = (max(int(v) - pad, 0) for v in every.min(axis=0))
    x1, y1 = (min(int(v) + pad + 1, image.shape[0]) for v in every.max(axis=0))
    if x1 <= x0 or y1 <= y0:
        return
    mask = np.zeros((y1 - y0, x1 - x0), np.float32)
    cv2.polylines(mask, [_fixed(line - (x0, y0)) for line in lines], False, 1.0, max(int(round(width)), 1), cv2.LINE_AA, 4)
    mask = cv2.GaussianBlur(mask, (0, 0), width * 0.6)
    _blend(image, (y0, x0), np.clip(mask / max(float(mask.max()), 1e-6), 0, 1) * strength, True)


def _muscles(e: Dict[str, float]) -> Dict[str, float]:
    """What the expression parameters ``e`` imply for the skin around the features, each
    in [0, ~1.2]: ``knit`` (brows lowered and drawn together, AU4: frown lines between
    them), ``cheek`` (cheeks raised, AU6, in a smile or a wrinkled nose: the lower lids
    pushed up, deep folds from nose to mouth), ``forehead`` (brows raised, AU1+2:
    horizontal lines), ``inner`` (inner brows raised, AU1: lines over the nose root),
    ``pout`` (chin raised, AU17, with the corners down: the lower lip pushed up),
    ``nose`` (nose wrinkled, AU9, with the upper lip raised) and ``press`` (lips pressed
    thin, AU24, with the brows knit and the jaw shut)."""
    knit = float(np.clip(0.6 * max(-e["brow_tilt"], 0.0) + 0.4 * max(-e["brow_raise"], 0.0), 0.0, 1.2))
    nose = max(e["lip_raise"], 0.0)
    return {
        "knit": knit,
        "cheek": float(np.clip(max(e["mouth_curve"], 0.0) + 0.6 * nose, 0.0, 1.2)),
        "forehead": max(e["brow_raise"], 0.0),
        "inner": max(e["brow_tilt"], 0.0),
        "pout": max(-e["mouth_curve"], 0.0),
        "nose": nose,
        "press": knit * float(np.clip(1.0 - 3.0 * max(e["jaw_open"], 0.0), 0.0, 1.0)),
    }


def _mouth_curves(e: Dict[str, float], m: Dict[str, float], opening: float, roundness: float, size: int, layout: Layout):
    """Outline points ``(25, 2)`` float in pixels, left to right: the upper lip's outer
    and inner edges, the lower lip's inner and outer edges, the upper teeth's lower edge
    and the lower teeth's upper edge."""
    cx, my = 0.5 * size, layout.mouth_y * size
    half = layout.mouth_rx * size * (1.0 + 0.25 * e["mouth_width"]) * (1.0 - 0.2 * roundness)
    corner_left = my - 0.03 * size * e["mouth_curve"]
    corner_right = corner_left - 0.03 * size * e["mouth_asym"]
    u = np.linspace(-1.0, 1.0, 25)
    bump = 1.0 - u**2
    corners = corner_left + (corner_right - corner_left) * (u + 1.0) / 2.0
    middle = corners * u**2 + my * bump
    jaw = jaw_opening(e["jaw_open"], opening)
    gap = JAW_GAP * size * jaw
    # Stretched lips open into a wide box, pursed ones into an O (surprise).
    shape = bump ** (0.7 - 0.45 * max(e["mouth_width"], 0.0) + 0.4 * max(-e["mouth_width"], 0.0))
    # A smile lifts the corners more than the middle of the upper lip, so the lips part
    # in a crescent that shows the upper teeth; a raised upper lip bares them too.
    smile = 0.012 * size * max(e["mouth_curve"], 0.0) * bump
    upper_inner = middle - 0.25 * gap * shape - smile - 0.024 * size * m["nose"] * np.sqrt(bump)
    lower_inner = middle + 0.75 * gap * shape
    upper_outer = upper_inner - 0.016 * size * (1.0 - 0.45 * m["press"]) * np.sqrt(bump)
    lower_outer = lower_inner + 0.021 * size * (1.0 + 0.3 * m["pout"] - 0.45 * m["press"]) * np.sqrt(bump)
    parted = lower_inner - upper_inner
    # The upper teeth fill a smile's parted lips; an open jaw shows the dark between them.
    # Pursed lips (an O) cover the teeth.
    teeth_height = 0.02 * size * shape * max(1.0 - 3.0 * max(-e["mouth_width"], 0.0), 0.0)
    jaw_part = np.maximum(parted - smile, 0.0)
    teeth = upper_inner + np.minimum(teeth_height, smile + jaw_part * float(np.clip(1.0 - 2.2 * jaw, 0.3, 1.0)))
    # Lips stretched wide pull down from the lower teeth too.
    lower_teeth = lower_inner - np.minimum(0.016 * size * shape * min(1.5 * max(e["mouth_width"], 0.0), 1.0), 0.2 * parted)
    x = cx + half * u
    return [np.stack([x, y], axis=1) for y in (upper_outer, upper_inner, lower_inner, lower_outer, teeth, lower_teeth)]


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
    ``(S, S, 3)`` uint8 RGB ``image``, with the folds and shadows of the skin that the
    expression moves (:func:`_muscles`). ``opening`` in [0, 1] is the speech's opening of
    the jaw over the expression's rest (:func:`jaw_opening`), ``roundness`` in [-1, 1]
    rounds (+) or spreads (-) the lips; ``blink`` scales the lid opening, ``gaze`` ``(x,
    y)`` in [-1, 1] moves the irises by up to :data:`GAZE_TRAVEL`."""
    out = image.copy()
    e = dict(zip(EXPRESSION_PARAMS, (float(v) for v in expression)))
    m = _muscles(e)
    _draw_relief(out, e, m, layout)
    _draw_brows(out, e, m, layout)
    for side in (-1.0, 1.0):
        _draw_eye(out, side, e, m, blink, iris_colour, layout, gaze)
    _draw_mouth(out, image, e, m, opening, roundness, layout)
    return out


def _draw_relief(out: np.ndarray, e: Dict[str, float], m: Dict[str, float], layout: Layout) -> None:
    """Eye sockets, forehead and frown lines, the wrinkled nose and the folds from nose to
    mouth: what a face shows of its muscles besides brows, lids and lips."""
    s = out.shape[0]
    lift = 0.028 * e["brow_raise"]
    for side in (-1.0, 1.0):
        cx = 0.5 + side * layout.eye_dx
        _tone(out, (cx, layout.eye_y - 0.022 + 0.3 * lift), (0.07, 0.042), -(0.2 + 0.12 * m["knit"]))
    xs = np.linspace(-1.0, 1.0, 15)
    forehead, inner = [], []
    for k in range(3):
        y = layout.brow_y - lift - 0.05 - 0.026 * k
        forehead.append(np.stack([0.5 + 0.11 * xs, y + 0.008 * xs**2], axis=1) * s)
        inner.append(np.stack([0.5 + 0.05 * xs, y + 0.004 - 0.006 * (1 - xs**2)], axis=1) * s)
    _crease(out, forehead, 0.2 * m["forehead"])
    _crease(out, inner, 0.2 * m["inner"])
    # Frown lines between the brows and, with a wrinkled nose, across its root and bridge.
    frown = [np.array([[0.5 + side * 0.012, layout.brow_y - 0.005], [0.5 + side * 0.009, layout.brow_y + 0.04]]) * s
             for side in (-1.0, 1.0)]
    _crease(out, frown, 0.42 * m["knit"])
    bridge = [np.stack([0.5 + 0.022 * xs, layout.eye_y + dy - 0.004 * (1 - xs**2)], axis=1) * s for dy in (0.012, 0.03, 0.046)]
    _crease(out, bridge, 0.4 * m["nose"])
    # Folds from the nose wings to past the mouth corners, deeper and closer to them
    # when the cheeks rise.
    corner = layout.mouth_rx * (1.0 + 0.25 * e["mouth_width"])
    t = np.linspace(0.0, 1.0, 12)[:, None]
    folds = []
    for side in (-1.0, 1.0):
        start = np.array([0.5 + side * 0.045, layout.nose_y - 0.004 - 0.01 * m["nose"]])
        bend = np.array([0.5 + side * (corner + 0.03), layout.mouth_y - 0.03 - 0.01 * e["mouth_curve"]])
        end = np.array([0.5 + side * (corner + 0.022), layout.mouth_y + 0.035])
        folds.append(((1 - t) ** 2 * start + 2 * t * (1 - t) * bend + t**2 * end) * s)
    _crease(out, folds, 0.38 * m["cheek"] + 0.05, width=1.8)
    for side in (-1.0, 1.0):  # nostrils flare and darken with the wrinkled nose
        _tone(out, (0.5 + side * 0.021, layout.nose_y), (0.014, 0.009), -0.3 * m["nose"])
        _tone(out, (0.5 + side * 0.115, layout.nose_y - 0.03), (0.045, 0.028), 0.14 * m["cheek"])


def _draw_brows(out: np.ndarray, e: Dict[str, float], m: Dict[str, float], layout: Layout) -> None:
    """A tapered arc per brow, thick at the inner end; knit brows come together and lose
    their arch, raised ones arch more."""
    import cv2

    s = out.shape[0]
    t = np.linspace(0.0, 1.0, 14)
    for side in (-1.0, 1.0):
        lift = 0.028 * e["brow_raise"] + (0.022 * e["brow_asym"] if side > 0 else 0.0)
        inner = layout.brow_y - lift - 0.028 * e["brow_tilt"]
        outer = layout.brow_y - lift + 0.014 * e["brow_tilt"]
        start = layout.brow_inner - 0.014 * m["knit"]
        arch = 0.014 + 0.006 * m["forehead"] - 0.008 * min(m["knit"], 1.0)
        xs = 0.5 + side * (start + (layout.brow_outer - start) * t)
        ys = inner + (outer - inner) * t - arch * np.sin(np.pi * t**0.8)
        thickness = 0.013 - 0.0065 * t
        top = np.stack([xs, ys - thickness], axis=1) * s
        bottom = np.stack([xs, ys + thickness], axis=1)[::-1] * s
        cv2.fillPoly(out, [_fixed(np.concatenate([top, bottom]))], BROW_COLOUR, cv2.LINE_AA, 4)


def _draw_eye(out, side, e, m, blink, iris_colour, layout, gaze) -> None:
    """One almond eye: the upper lid opens with ``eye_open``, the lower lid is pushed up
    by raised cheeks (to a crescent in a broad smile); the iris sits under the upper lid,
    a lash line over it, a crease above it."""
    import cv2

    s = out.shape[0]
    cx, cy = (0.5 + side * layout.eye_dx) * s, layout.eye_y * s
    rx, ry = layout.eye_rx * s, layout.eye_ry * s
    # Lids lowered below neutral close in slowly, and a raised cheek pushes the lower lid
    # only a little: the lids stop short of the pupil (a soft floor at 1.3 px beyond its
    # edge), which the gaze is measured by.
    wide = float(np.clip(1.0 + e["eye_open"], 0.05, 2.0))
    up = 1.15 * ry * (wide if wide >= 1.0 else 1.0 - 0.6 * (1.0 - wide))
    low = ry * (0.85 * float(np.clip(1.0 + 0.4 * e["eye_open"], 0.2, 1.5)) - 0.6 * m["cheek"])
    clear, soft = 0.45 * layout.iris_r * s + 1.3, 0.4
    up, low = ((clear + soft * np.logaddexp(0.0, (v - clear) / soft)) * blink for v in (up, low))
    u = np.linspace(-1.0, 1.0, 21)
    xs = cx + rx * u
    # The lids follow the eyes up and down (as real lids do), which keeps the pupil clear
    # of them whatever the gaze.
    level = cy + 0.8 * gaze[1] * GAZE_TRAVEL[1] * s
    upper = level - up * (1.0 - u**2) ** 0.7
    lower = np.maximum(level + low * (1.0 - u**2), upper + 0.3)
    crease = upper - (0.012 + 0.006 * max(e["eye_open"], 0.0)) * s * np.sqrt(1.0 - u**2)
    keep = np.abs(u) < 0.85
    _crease(out, [np.stack([xs[keep], crease[keep]], axis=1)], 0.3 * (1.0 - 0.6 * min(m["knit"], 1.0)))
    _crease(out, [np.stack([xs[keep], lower[keep] + 0.012 * s], axis=1)], 0.3 * m["cheek"])
    x0, x1 = int(cx - rx) - 3, int(cx + rx) + 4
    y0, y1 = int(cy - 2.6 * ry) - 3, int(cy + 2.6 * ry) + 4
    roi = out[y0:y1, x0:x1]
    outline = np.concatenate([np.stack([xs, upper], axis=1), np.stack([xs, lower], axis=1)[::-1]]) - (x0, y0)
    mask = np.zeros(roi.shape[:2], np.uint8)
    cv2.fillPoly(mask, [_fixed(outline)], 255, cv2.LINE_AA, 4)
    # The eyeball is shaded under the upper lid and towards the corners, so a wide-open
    # eye shows a band of white, not a bright ring.
    rows, cols = np.mgrid[0 : roi.shape[0], 0 : roi.shape[1]].astype(np.float32)
    lid = np.interp(cols + x0, xs, upper) - y0
    under_lid = np.exp(-np.clip(rows - lid, 0.0, None) / (0.012 * s))
    shading = 1.0 - 0.35 * under_lid - 0.15 * np.clip((cols + x0 - cx) / rx, -1, 1) ** 2
    eye = np.round(np.asarray(SCLERA_COLOUR, np.float32) * shading[..., None]).astype(np.uint8)
    iris = layout.iris_r * s
    looking = np.array([cx - x0 + gaze[0] * GAZE_TRAVEL[0] * s, cy - y0 + gaze[1] * GAZE_TRAVEL[1] * s])
    centre = tuple(int(v) for v in np.round(looking * 16))
    cv2.circle(eye, centre, int(round(iris * 16)), iris_colour, -1, cv2.LINE_AA, 4)
    cv2.circle(eye, centre, int(round(iris * 0.45 * 16)), (18, 14, 14), -1, cv2.LINE_AA, 4)
    glint = tuple(int(v) for v in np.round((looking + iris * np.array([0.33, -0.33])) * 16))
    cv2.circle(eye, glint, max(int(round(iris * 0.18 * 16)), 16), (255, 255, 255), -1, cv2.LINE_AA, 4)
    alpha = (mask.astype(np.float32) / 255.0)[..., None]
    roi[:] = np.round(roi * (1.0 - alpha) + eye * alpha).astype(np.uint8)
    # The lash line sits on the lid's edge, not over the opening.
    lash_width = max(int(round(0.01 * s)), 2)
    lash = np.stack([xs, upper - 0.5 * lash_width * np.sqrt(1.0 - u**2)], axis=1)
    cv2.polylines(out, [_fixed(lash)], False, LID_COLOUR, lash_width, cv2.LINE_AA, 4)
    # The lower lid's rim: the skin beside the eye, darkened.
    rim = tuple(int(v * 0.7) for v in out[int(cy), int(cx + side * 1.4 * rx)])
    cv2.polylines(out, [_fixed(np.stack([xs, lower], axis=1)[3:-3])], False, rim, 1, cv2.LINE_AA, 4)


def _draw_mouth(out, image, e, m, opening, roundness, layout) -> None:
    """Lips in the skin's own tone (:data:`LIP_TINT`), the dark inside, the teeth and a
    seam when closed; the shadow under the lower lip, deeper when the chin pushes it up.
    ``image`` is the portrait before any drawing, whose cheek gives the skin's colour."""
    import cv2

    s = out.shape[0]
    upper_outer, upper_inner, lower_inner, lower_outer, teeth, lower_teeth = _mouth_curves(
        e, m, opening, roundness, s, layout
    )
    bottom = float(lower_outer[:, 1].max()) / s
    _tone(out, (0.5, bottom + 0.016), (0.045, 0.011), -(0.16 + 0.2 * m["pout"]))
    for end in (upper_inner[0], upper_inner[-1]):
        _tone(out, tuple(end / s), (0.008, 0.008), -0.25)
    rows, cols = _windows(s, layout)["cheeks"]
    skin = np.median(image[rows, cols].reshape(-1, 3), axis=0)
    lip_colour = tuple(int(v) for v in skin * np.asarray(LIP_TINT))
    lips = np.concatenate([upper_outer, lower_outer[::-1]])
    cv2.fillPoly(out, [_fixed(lips)], lip_colour, cv2.LINE_AA, 4)
    if np.max(lower_inner[:, 1] - upper_inner[:, 1]) > 0.6:
        inside = np.concatenate([upper_inner, lower_inner[::-1]])
        cv2.fillPoly(out, [_fixed(inside)], MOUTH_COLOUR, cv2.LINE_AA, 4)
        middle = slice(4, 21)
        for edge, gum in ((teeth, upper_inner), (lower_teeth, lower_inner)):
            if np.max(np.abs(edge - gum)[middle, 1]) < 0.5:
                continue
            cv2.fillPoly(out, [_fixed(np.concatenate([gum[middle], edge[middle][::-1]]))], TEETH_COLOUR, cv2.LINE_AA, 4)
    cv2.polylines(out, [_fixed(upper_inner)], False, tuple(int(v * 0.55) for v in lip_colour), 1, cv2.LINE_AA, 4)


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
BACKGROUND_GREY = {"light skin": (70.0, 115.0), "dark skin": (185.0, 235.0)}
"""Grey-level band of a default portrait's background: dark behind light skin (grey level
over 140), light behind dark skin. A face on a background of its own grey level, as
pastel backgrounds behind light skin were, is missed by the Haar face detector on
most expressive frames, and a reader then sees the whole picture instead of the face."""


def _label(value) -> str:
    return "".join(ch for ch in str(value or "").lower() if ch.isalnum())


def _background(rng: np.random.Generator, skin: np.ndarray, size: int) -> np.ndarray:
    """``(size, size, 3)`` uint8: a soft vertical gradient between two seeded colours,
    their grey levels brought into the band of :data:`BACKGROUND_GREY` that sets them apart
    from ``skin`` ``(3,)``."""
    colours = np.stack([rng.uniform(150, 235, size=3), rng.uniform(110, 215, size=3)])  # (2, 3) top, bottom
    lo, hi = BACKGROUND_GREY["light skin" if float(skin @ LUMA) > 140.0 else "dark skin"]
    grey = colours @ LUMA
    # The seeded grey levels (110-235) map onto the band in order, so seeds still differ.
    colours *= ((lo + (hi - lo) * np.clip((grey - 110.0) / 125.0, 0.0, 1.0)) / grey)[:, None]
    colours = np.clip(colours, 0.0, 255.0)
    t = np.linspace(0.0, 1.0, size)[:, None, None]
    return np.broadcast_to(colours[0] * (1 - t) + colours[1] * t, (size, size, 3)).astype(np.uint8).copy()


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
    image = _background(rng, skin, s)

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
    _light_face(image, ax, ay)
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


def _light_face(image: np.ndarray, ax: float, ay: float) -> None:
    """Light the flat head oval (half-axes ``ax``, ``ay``) from the front: the sides turn
    away into shadow, the forehead, nose bridge and cheekbones catch the light, the nose
    casts a soft shadow. A face detector, and a person, find a face by this relief (eyes
    and sides darker than the nose bridge and cheeks), not by its outline."""
    s = image.shape[0]
    head_cx, head_cy = LAYOUT.head_centre
    ys, xs = np.mgrid[0:s, 0:s] / float(s)
    r2 = ((xs - head_cx) / ax) ** 2 + ((ys - head_cy) / ay) ** 2
    # The outer 45 % of each half of the face turns away from the light.
    side = np.clip((np.abs(xs - head_cx) / ax - 0.55) / 0.45, 0.0, 1.0) ** 1.5
    shadow = (0.32 * side * (r2 <= 1.02))[..., None]
    image[:] = np.round(image * (1.0 - shadow)).astype(np.uint8)
    # Dark skin shows its relief by its highlights more than by its shadows.
    luma = float(image[_px(0.5, s), _px(0.5, s)] @ LUMA)
    gain = 1.0 + 1.5 * max(0.0, 0.75 - luma / 255.0)
    _tone(image, (0.5, 0.29), (0.13, 0.05), 0.18 * gain)
    _tone(image, (0.5, 0.53), (0.014, 0.06), 0.22 * gain)
    for side_sign in (-1, 1):
        _tone(image, (0.5 + side_sign * 0.125, 0.56), (0.06, 0.03), 0.08 * gain)
        _tone(image, (0.5 + side_sign * 0.027, 0.55), (0.01, 0.045), -0.22)
    _tone(image, (0.5, 0.618), (0.03, 0.01), -0.3)


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

    # The skin is sampled low on the cheek, clear of the lit cheekbone and of the folds
    # that an expression moves.
    windows = {"mouth": box(0.36, 0.64, 0.605, 0.80), "cheeks": box(0.29, 0.33, 0.59, 0.63)}
    for name, side in (("left", -1), ("right", 1)):
        # Inside the hairline (26 % of the height, lower beyond 19 % from the middle).
        inner, outer = 0.5 + side * 0.035, 0.5 + side * 0.185
        windows[f"brow_{name}"] = box(min(inner, outer), max(inner, outer), layout.brow_y - 0.105, layout.brow_y + 0.05)
        cx = 0.5 + side * layout.eye_dx
        # Around the widest eye the lids open to, and little of the skin beside it.
        windows[f"eye_{name}"] = box(cx - layout.eye_rx, cx + layout.eye_rx, layout.eye_y - 0.042, layout.eye_y + 0.042)
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
    "pupil_aside",
)
"""The columns of :func:`face_geometry`."""


def face_geometry(frames: np.ndarray, layout: Layout = LAYOUT) -> np.ndarray:
    """``(F, S, S, 3)`` uint8 RGB frames of this renderer -> ``(F, 17)`` geometry per frame
    (:data:`GEOMETRY_COLUMNS`; lengths as fractions of the side, areas in % of the
    frame): per brow its height at the window centre and its slope (inner end up is
    positive); per eye the mean sclera height; the mouth's width, the height, slope and
    curvature of its top edge, the height of its bottom edge, its dark (open) area, its
    teeth area and the height of its mid-line; and where the pupils are (the centroid of
    the near-black pixels in each eye's opening, from the eye's centre in the layout,
    mean of both eyes; 0 when the eyes are shut), which follows the gaze, and how far
    aside they are either way."""
    f, size = frames.shape[0], frames.shape[1]
    x = frames.astype(np.float32)
    luma = x @ LUMA.astype(np.float32)  # (F, S, S)
    w = _windows(size, layout)
    cheeks = x[:, w["cheeks"][0], w["cheeks"][1]].reshape(f, -1, 3)
    skin = np.median(cheeks, axis=1)  # (F, 3)
    skin_luma = skin @ LUMA
    channel_min, channel_max = x.min(axis=-1), x.max(axis=-1)
    white = (channel_min > 185) & (channel_max - channel_min < 32)
    # The eyeball is shaded down to half its white under the lid and at the corners, but
    # stays grey where any skin, however lit or shadowed, keeps its hue.
    sclera = (channel_min > 100) & (channel_max - channel_min < 24)
    out = []

    for name in ("left", "right"):
        rows, cols = w[f"brow_{name}"]
        dark = luma[:, rows, cols] < (0.55 * skin_luma)[:, None, None]  # (F, h, w)
        # The brow is the topmost dark run of each column: under it the lash line comes
        # into the window when the eyes open wide or the brows come down.
        started = np.cumsum(dark, axis=1) > 0
        dark &= ~(np.cumsum(started & ~dark, axis=1) > 0)
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
        out.append(sclera[:, rows, cols].sum(axis=(1, 2)) / (cols.stop - cols.start) / size)
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
    lips = region[..., 0] > 1.6 * region[..., 1] + 8.0
    dark = luma[:, rows, cols] < np.minimum(70.0, 0.45 * skin_luma)[:, None, None]
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
    fit = _quadratic_fits(u, np.nan_to_num(top), column_any & (np.abs(u) <= 0.9))
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
        # The irises aside either way cover the white of one corner and bare the other's,
        # which the openness columns would otherwise read as a change of the lids.
        np.abs(pupil[:, 0]),
    ]
    return np.stack(out, axis=1)


def _quadratic_fits(u: np.ndarray, y: np.ndarray, use: np.ndarray) -> np.ndarray:
    """Per row, the least-squares ``y = c0 + c1 u + c2 u^2`` over the points ``use``:
    ``u``, ``y``, ``use`` are ``(F, W)``; returns ``(F, 3)`` coefficients, 0 for a row of
    fewer than 3 points."""
    basis = np.stack([np.ones_like(u), u, u**2], axis=-1) * use[..., None]  # (F, W, 3)
    gram = np.einsum("fwi,fwj->fij", basis, basis)
    moments = np.einsum("fwi,fw->fi", basis, y)
    enough = use.sum(axis=1) >= 3
    fits = np.zeros((u.shape[0], 3))
    if enough.any():
        fits[enough] = np.linalg.solve(gram[enough], moments[enough][..., None])[..., 0]
    return fits
