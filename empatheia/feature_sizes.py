"""Shapes of the features each generator reads, which size Empatheia's output heads.

These are facts of the published models, so a change here must follow the checkpoints.
Both the model's config (the heads' default widths) and the generators read them, so they
sit here, below both, importing nothing of either.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GeneratorFeatures:
    name: str
    content_dim: int
    """Width of one content unit (a phoneme for speech, a video frame for the face)."""
    content_unit: str
    style_dim: int
    units_per_char: float
    """Rough content units per character of English response text, used to size the
    content features when the generator has not said how long they must be."""


STYLETTS2_FEATURES = GeneratorFeatures(
    name="StyleTTS2",
    # Per phoneme: acoustic text encoder output (512) followed by the PL-BERT output
    # projected by `bert_encoder` (768 -> 512), the two text-side inputs of the decoder
    # and the prosody predictor (LibriTTS config, hidden_dim 512).
    content_dim=512 + 512,
    content_unit="phoneme",
    # Reference style: acoustic style encoder (128) followed by the prosodic one (128).
    style_dim=128 + 128,
    # Phoneme tokens per character of English text (gruut IPA in espeak spelling, spaces
    # and punctuation included): 1.21 measured over 1,500 EmpatheticDialogues responses.
    units_per_char=1.21,
)

DREAMTALK_FEATURES = GeneratorFeatures(
    name="DreamTalk",
    # Per 25 fps video frame: the audio content encoder's output over its window of
    # 2 * 5 + 1 = 11 wav2vec2 frames at d_model 256, flattened window-major (11 x 256).
    content_dim=11 * 256,
    content_unit="frame",
    # Style code pooled from up to 256 frames of 64-d expression coefficients.
    style_dim=256,
    # 25 frames per second over about 14 characters per second of conversational speech.
    units_per_char=25.0 / 14.0,
)
