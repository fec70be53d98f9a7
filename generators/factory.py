"""Build the generators a model's config names, checked against the sizes of its heads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from .base import SpeechGenerator, TalkingHeadGenerator

if TYPE_CHECKING:
    from empatheia.config import EmpatheiaConfig

SPEECH = ("styletts2", "piper")
TALKING_HEADS = ("dreamtalk", "avatar")


def build_generators(config: "EmpatheiaConfig") -> Tuple[SpeechGenerator, TalkingHeadGenerator]:
    """The speech and talking-head generators of ``config.generators``. The offline ones
    (``piper``, ``avatar``) take the heads' sizes; the paper's must match them."""
    return build_speech_generator(config), build_talking_head(config)


def build_speech_generator(config: "EmpatheiaConfig") -> SpeechGenerator:
    """The speech generator of ``config.generators`` alone: a text answer needs its units
    (the Content Synchronizer's length and ids) but no talking head, whose checkpoints a
    user may not have."""
    choice = config.generators
    cs, sd = config.content_synchronizer, config.style_disentangler
    if choice.speech == "piper":
        from .piper_speech import PiperSpeech

        speech: SpeechGenerator = PiperSpeech(content_dim=cs.speech_content_dim, style_dim=sd.speech_style_dim)
    elif choice.speech == "styletts2":
        from .styletts2 import StyleTTS2Config, StyleTTS2Speech

        speech = StyleTTS2Speech.from_config(StyleTTS2Config(**choice.styletts2))
    else:
        raise ValueError(f"generators.speech: unknown generator {choice.speech!r}; choose one of {list(SPEECH)}")
    _check_sizes("speech", speech, cs.speech_content_dim, sd.speech_style_dim)
    return speech


def build_talking_head(config: "EmpatheiaConfig") -> TalkingHeadGenerator:
    """The talking-head generator of ``config.generators`` alone."""
    choice = config.generators
    cs, sd = config.content_synchronizer, config.style_disentangler
    if choice.talking_head == "avatar":
        from .avatar_renderer import AvatarRenderer

        head: TalkingHeadGenerator = AvatarRenderer(content_dim=cs.video_content_dim, style_dim=sd.video_style_dim)
    elif choice.talking_head == "dreamtalk":
        from .dreamtalk import DreamTalk, DreamTalkConfig

        head = DreamTalk.from_pretrained(DreamTalkConfig(**choice.dreamtalk))
    else:
        raise ValueError(
            f"generators.talking_head: unknown generator {choice.talking_head!r}; choose one of {list(TALKING_HEADS)}"
        )
    _check_sizes("talking_head", head, cs.video_content_dim, sd.video_style_dim)
    return head


def _check_sizes(role: str, generator, content_dim: int, style_dim: int) -> None:
    features = generator.features
    if (features.content_dim, features.style_dim) != (content_dim, style_dim):
        raise ValueError(
            f"generators.{role}: {features.name} reads content {features.content_dim}-d and style "
            f"{features.style_dim}-d, but the model's heads write {content_dim}-d and {style_dim}-d; "
            "use a model built for this generator"
        )
