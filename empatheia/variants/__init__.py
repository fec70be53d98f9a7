"""The field's other systems over the same parts (docs/variants.md): the paper's pipeline
baseline (:mod:`.pipeline`), E3RG (:mod:`.e3rg`), MERIA (:mod:`.meria`) and early fusion
(:mod:`.early_fusion`), built by :mod:`.build`."""

SYSTEMS = ("empatheia", "pipeline", "e3rg", "meria", "early_fusion")
"""What ``--system`` chooses from (``empatheia``: the model itself)."""

MODALITIES = ("text", "audio", "video")
"""The user's modalities that MERIA and early fusion read, in the order their stacked
tensors (e.g. UGF's weights) use."""
