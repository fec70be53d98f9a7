"""setup.py's literal arguments, read from its source (nothing is built or run)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def setup_arguments():
    """``{keyword: value}`` of the ``setup(...)`` call for every keyword whose value is a
    literal (``packages``, ``package_dir``, ``package_data``, ``entry_points``, ...)."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
    found = {}
    for keyword in call.keywords:
        try:
            found[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            continue  # computed from a name (requirements lists and the like)
    return found
