"""empatheia: multimodal empathetic response generation.

>>> from empatheia import Empatheia, Dialogue, Turn
>>> model = Empatheia.from_preset("tiny")
>>> response = model.respond(Dialogue([Turn("speaker", "I failed my driving test again.")]))
"""

from .config import EmpatheiaConfig
from .dialogue import Dialogue, Turn
from .modeling import Empatheia
from .processing import EmpatheiaProcessor, Target
from .prompts import ChainOfEmpathy, PromptMode
from .response import EmpatheticResponse, LabelPrediction

__version__ = "0.1.0"

__all__ = [
    "ChainOfEmpathy",
    "Dialogue",
    "Empatheia",
    "EmpatheiaConfig",
    "EmpatheiaProcessor",
    "EmpatheticResponse",
    "LabelPrediction",
    "PromptMode",
    "Target",
    "Turn",
]
