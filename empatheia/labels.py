"""Label sets of the AvaMERG benchmark: 7 coarse emotions and the avatar profile
attributes (§3, Appendix C). A dataset with other label sets passes its own lists through
:class:`~empatheia.config.StyleDisentanglerConfig`."""

EMOTION_LABELS = ("sad", "happy", "angry", "fear", "surprised", "contempt", "disgusted")
AGE_LABELS = ("child", "young", "middle-aged", "elderly")
GENDER_LABELS = ("male", "female")
TIMBRE_LABELS = ("high", "mid", "low")
