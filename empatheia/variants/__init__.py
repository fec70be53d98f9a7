"""The field's other systems over the same parts (docs/variants.md): the paper's pipeline
baseline (:mod:`.pipeline`), E3RG (:mod:`.e3rg`), MERIA (:mod:`.meria`) and early fusion
(:mod:`.early_fusion`), built by :mod:`.build`."""

SYSTEMS = ("empatheia", "pipeline", "e3rg", "meria", "early_fusion")
"""What ``--system`` chooses from (``empatheia``: the model itself)."""
