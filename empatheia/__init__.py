"""empatheia: multimodal empathetic response generation.

>>> from empatheia import Empatheia, Dialogue, Turn
>>> model = Empatheia.from_preset("tiny")
>>> response = model.respond(Dialogue([Turn("speaker", "I failed my driving test again.")]))
"""

from typing import TYPE_CHECKING

from .lazy import lazy_attributes

__version__ = "0.1.0"

# Loaded on first use (empatheia.lazy).
_EXPORTS = {
    "ChainOfEmpathy": ".prompts",
    "Dialogue": ".dialogue",
    "Empatheia": ".modeling",
    "EmpatheiaConfig": ".config",
    "EmpatheiaProcessor": ".processing",
    "EmpatheticResponse": ".response",
    "LabelPrediction": ".response",
    "PromptMode": ".prompts",
    "Target": ".processing",
    "Turn": ".dialogue",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .config import EmpatheiaConfig as EmpatheiaConfig
    from .dialogue import Dialogue as Dialogue, Turn as Turn
    from .modeling import Empatheia as Empatheia
    from .processing import EmpatheiaProcessor as EmpatheiaProcessor, Target as Target
    from .prompts import ChainOfEmpathy as ChainOfEmpathy, PromptMode as PromptMode
    from .response import EmpatheticResponse as EmpatheticResponse, LabelPrediction as LabelPrediction


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _EXPORTS)
