"""Speech and talking-head generators that Empatheia's heads drive.

This package currently holds :mod:`generators.features`, the shapes of the content and
style features each generator reads; the generator implementations build on them.
"""

from .features import DREAMTALK_FEATURES, STYLETTS2_FEATURES, GeneratorFeatures

__all__ = ["GeneratorFeatures", "STYLETTS2_FEATURES", "DREAMTALK_FEATURES"]
