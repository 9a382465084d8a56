"""The fast test lane (``make test-fast``): which test files stay out of it, and why.

A test file is outside the fast lane when what it uses is slow, read from its source (so a moved or
renamed file keeps its lane, and a new file that uses a slow thing is out of the lane from the start):

* it imports a slow harness or framework: the browser (``support.chromium``), Node (the Flux parser,
  the Grafana types harness), multi-process torch (``torch.distributed``, ``torch.multiprocessing``,
  the multi-rank scenarios), or a training framework whose import alone takes seconds;
* a program it starts is written in it and imports torch (a training process spawned with torch),
  or it names a slow program (``node``, ``npm``, ``chromium``, ``torchrun``) as a literal;
* it says so itself: a module-level ``pytest.mark.slow`` (wheel builds, fresh clones, the real
  agent end to end, anything else measured slow with ``pytest --durations``).

The root ``conftest.py`` marks every test of such a file ``slow``; ``pytest --fast`` does not even
import those files, and deselects any other test marked ``slow``.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

#: imports (a module or a package of modules) that put a test file outside the fast lane
SLOW_IMPORTS = (
    "support.chromium",
    "grafana_ts",
    "support.flux_parser",
    "ranks_truth",
    "torch.distributed",
    "torch.multiprocessing",
    "pytorch_lightning",
    "lightning",
    "transformers",
    "accelerate",
)
#: programs that a literal names: a test that starts one of them is slow
SLOW_PROGRAMS = frozenset({"node", "npm", "npx", "tsc", "chromium", "chromium-browser", "torchrun"})
#: a program written in the test file that imports torch
_TORCH_SCRIPT = re.compile(r"^\s*(import torch|from torch)\b", re.M)


def _is_slow_import(name: str) -> bool:
    return any(name == slow or name.startswith(slow + ".") for slow in SLOW_IMPORTS)


def _imports(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def _marks_slow(node: ast.AST) -> bool:
    """``pytest.mark.slow`` (or ``mark.slow``) anywhere in a module-level statement."""
    return isinstance(node, ast.Attribute) and node.attr == "slow" and ast.unparse(node.value).endswith("mark")


@functools.cache
def slow_reason(path: Path) -> str | None:
    """Why the test file at ``path`` is outside the fast lane, or None when it is in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        for name in _imports(node):
            if _is_slow_import(name):
                return f"imports {name}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in SLOW_PROGRAMS:
                return f"starts {node.value}"
            if "\n" in node.value and _TORCH_SCRIPT.search(node.value):
                return "starts a program that imports torch"
    for stmt in tree.body:
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
            _marks_slow(n) for n in ast.walk(stmt)
        ):
            return "marked slow at module level"
    return None
