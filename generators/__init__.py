"""Speech and talking-head generators that Empatheia's heads drive (§4.3, Appendix D.2).

* :mod:`empatheia.generators.base`: the two roles (:class:`SpeechGenerator`,
  :class:`TalkingHeadGenerator`), :class:`Waveform`, :class:`VideoFrames`, :class:`Avatar`
  and the gold-feature extractors of training stages 2-4.
* the paper's generators: :mod:`empatheia.generators.styletts2` and :mod:`empatheia.generators.dreamtalk`;
* the offline ones of the ``small`` preset: :mod:`empatheia.generators.piper_speech` and
  :mod:`empatheia.generators.avatar_renderer`;
* :mod:`empatheia.generators.avatars`: the memory that keeps each avatar's voice and face;
* :data:`DREAMTALK_FEATURES`, :data:`STYLETTS2_FEATURES`: the feature sizes each generator
  reads (defined in :mod:`empatheia.feature_sizes`, which the model's config reads too).
"""

from empatheia.feature_sizes import DREAMTALK_FEATURES, STYLETTS2_FEATURES, GeneratorFeatures

from .avatars import AvatarRegistry, avatar_key
from .base import (
    Avatar,
    SpeechGenerator,
    TalkingHeadGenerator,
    VideoFrames,
    Waveform,
    gold_feature_extractors,
    resample_rows,
)
from .factory import SPEECH, TALKING_HEADS, build_generators, build_speech_generator, build_talking_head

__all__ = [
    "Avatar",
    "AvatarRegistry",
    "DREAMTALK_FEATURES",
    "SPEECH",
    "TALKING_HEADS",
    "GeneratorFeatures",
    "STYLETTS2_FEATURES",
    "SpeechGenerator",
    "TalkingHeadGenerator",
    "VideoFrames",
    "Waveform",
    "avatar_key",
    "build_generators",
    "build_speech_generator",
    "build_talking_head",
    "gold_feature_extractors",
    "resample_rows",
]
