"""Package names loaded on first use (PEP 562): importing ``empatheia`` or
``empatheia.data`` costs only what the caller then uses, so ``empatheia --help`` and the
light tools never import torch, transformers and peft."""

from importlib import import_module
from typing import Any, Callable, Dict, List, Tuple


def lazy_attributes(package: str, namespace: Dict[str, Any], exports: Dict[str, str]) -> Tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names ``exports``
    maps to the modules that define them (relative to the package, e.g. ``".modeling"``).
    A name, once loaded, is kept in ``namespace`` (the package's globals), so it is
    looked up only once."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(exports[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
