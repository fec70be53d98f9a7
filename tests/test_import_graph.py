"""The installed package's import graph, read from the source: no circles, and nothing in
the library imports upwards into the recipes or the command line.

Every ``import`` counts, also those inside functions or under ``if TYPE_CHECKING:``: an
import deferred into a function still ties the two modules together, it only hides the
circle until run time.
"""

import ast

from .setup_arguments import REPO, setup_arguments


def _package_roots():
    """``{installed package: source folder}``: ``empatheia/`` and setup.py's ``package_dir``
    mappings, so the test follows the install layout instead of repeating it."""
    mapped = setup_arguments().get("package_dir", {})
    return {"empatheia": REPO / "empatheia", **{name: REPO / folder for name, folder in mapped.items()}}


def modules():
    """``{module name: file}`` of every Python file the package installs."""
    found = {}
    for package, folder in _package_roots().items():
        for file in folder.rglob("*.py"):
            parts = [part for part in file.relative_to(folder).with_suffix("").parts if part != "__init__"]
            found[".".join([package, *parts])] = file
    return found


def _imported(node, module, is_package, known):
    """The modules of ``known`` that one import statement of ``module`` names."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        # `from package import module` imports the module; `from module import name` the module.
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target:
            found.add(target)
    return found


def import_graph():
    """``{module: {modules it imports}}`` within the package."""
    known = modules()
    graph = {}
    for name, file in known.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, name, file.name == "__init__.py", known)
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph):
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(start):
        # Iterative, so a deep package cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# The top of the graph: what runs the library. Nothing below may import these.
TOP_MODULES = ("empatheia.__main__", "empatheia.cli", "empatheia.evaluation.cli")
RECIPES = "empatheia.recipes"


def _is_top(name):
    return name in TOP_MODULES or name == RECIPES or name.startswith(RECIPES + ".")


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]


def test_relative_imports_resolve_against_the_package():
    known = {"empatheia", "empatheia.data", "empatheia.data.cache", "empatheia.modeling"}
    node = ast.parse("from ..modeling import Empatheia").body[0]
    assert _imported(node, "empatheia.data.cache", False, known) == {"empatheia.modeling"}
    node = ast.parse("from . import cache").body[0]
    assert _imported(node, "empatheia.data", True, known) == {"empatheia.data.cache"}


def test_the_graph_covers_the_installed_package():
    graph = import_graph()
    assert "empatheia.modeling" in graph and "empatheia.cli" in graph
    assert any(name.startswith("empatheia.generators.") for name in graph)
    assert any(name.startswith(RECIPES + ".") for name in graph)
    # Modules really import each other (the reader is not blind).
    assert "empatheia.config" in graph["empatheia.modeling"]


def test_the_import_graph_has_no_circles():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(component) for component in found)


def test_the_library_never_imports_the_recipes_or_the_command_line():
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in import_graph().items() if not _is_top(name)
        for target in targets if _is_top(target)
    )
    assert not upward, "\n".join(upward)

