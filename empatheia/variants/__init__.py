"""The field's other systems over the same parts (docs/variants.md): the paper's pipeline
baseline (:mod:`.pipeline`) and E3RG (:mod:`.e3rg`), built by :mod:`.build`."""

SYSTEMS = ("empatheia", "pipeline", "e3rg")
"""What ``--system`` chooses from (``empatheia``: the model itself)."""
