"""Which modules of the package import which: the stages sit below the model, the
processor and the data pipeline, and the media cache, the model and the processor import
no circle (an import under ``if TYPE_CHECKING:`` counts too)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set

PACKAGE = Path(__file__).resolve().parents[1] / "empatheia"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Set[str]:
    """The package's modules that ``path`` imports anywhere in it, by dotted name."""
    package = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from . import x` names a module
    return {name for name in found if name.split(".")[0] == "empatheia"}


def _graph() -> Dict[str, Set[str]]:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _reaches(graph: Dict[str, Set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(graph[start])
    while todo:
        name = todo.pop()
        if name == goal:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return False


def test_stages_import_nothing_of_the_model_the_processor_or_the_data():
    graph = _graph()
    assert graph["empatheia.stages"] <= {"empatheia.prompts"}
    for user in ("empatheia.modeling", "empatheia.processing", "empatheia.data.dataset", "empatheia.training.data"):
        assert "empatheia.stages" in graph[user], user
    for above in ("empatheia.modeling", "empatheia.processing", "empatheia.data.dataset", "empatheia.data.cache"):
        assert not _reaches(graph, "empatheia.stages", above), above


def test_the_media_cache_the_model_and_the_processor_import_no_circle():
    graph = _graph()
    three = ("empatheia.modeling", "empatheia.processing", "empatheia.data.cache")
    for name in three:
        assert not _reaches(graph, name, name), f"{name} imports itself back"
    assert "empatheia.modeling" not in graph["empatheia.data.cache"]
    assert "empatheia.data.cache" not in graph["empatheia.processing"] | graph["empatheia.modeling"]
