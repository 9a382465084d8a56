"""The fast test lane (``make test-fast``): which tests stay out of it, and why.

A test is outside the fast lane when what it uses is slow, read from its file's source (so a moved or
renamed file keeps its lane, and a new test that uses a slow thing is out of the lane from the start):

* it imports a slow harness or framework: the browser (``support.chromium``), Node (the Flux parser and
  the InfluxDB 2 stand-in that uses it, the Grafana types harness), the real agent as a process
  (``agentproc``), multi-process torch (``torch.distributed``, ``torch.multiprocessing``, the
  multi-rank scenarios), or a training framework whose import alone takes seconds;
* it starts a slow program: one named as a literal (``node``, ``npm``, ``chromium``, ``torchrun``), a
  program written in the file that imports torch (a training process), ``gpulse demo``, a wheel
  build (``pip wheel``) or a fresh clone (``git clone``);
* it says so itself: a module-level ``pytest.mark.slow`` (anything else measured slow with
  ``pytest --durations``), or ``@pytest.mark.slow`` on the test.

What a test function uses puts that test out; what the rest of its module uses (imports, helpers,
fixtures, scripts) puts the whole file out. The root ``conftest.py`` marks those tests ``slow``;
``pytest --fast`` does not even import a file that is out as a whole, and deselects every test marked
``slow``. A slow program started in the lane through something this cannot see fails its test there.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

#: imports (a module or a package of modules) that put a test file outside the fast lane
SLOW_IMPORTS = (
    "support.chromium",
    "grafana_ts",
    "support.flux_parser",
    "support.fake_influx_v2_admin",  # checks every Flux script with the Flux parser, under Node
    "ranks_truth",
    "agentproc",  # the real agent as a process, end to end
    "torch.distributed",
    "torch.multiprocessing",
    "pytorch_lightning",
    "lightning",
    "transformers",
    "accelerate",
)
#: programs that a literal names: a test that starts one of them is slow
SLOW_PROGRAMS = frozenset({"node", "npm", "npx", "tsc", "chromium", "chromium-browser", "torchrun", "check-jsonschema"})
#: commands that a list literal spells out: wheel builds and fresh clones
SLOW_COMMANDS = {("pip", "wheel"): "builds a wheel", ("git", "clone"): "clones the repository"}
#: a program written in the test file that imports torch
_TORCH_SCRIPT = re.compile(r"^\s*(import torch|from torch)\b", re.M)
#: gpulse's demo (hours of simulated data through the whole pipeline)
_DEMO = re.compile(r"^gpulse demo\b")


@dataclass(frozen=True)
class Lane:
    """Why a test file is outside the fast lane (``file``), or else which of its tests are, and why."""

    file: str | None
    tests: dict[str, str]

    def reason(self, test: str) -> str | None:
        """Why the test function named ``test`` is outside the fast lane (None: it is in it)."""
        return self.file or self.tests.get(test)


def _is_slow_import(name: str) -> bool:
    return any(name == slow or name.startswith(slow + ".") for slow in SLOW_IMPORTS)


def _imports(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def _literal_reason(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value in SLOW_PROGRAMS:
            return f"starts {node.value}"
        if "\n" in node.value and _TORCH_SCRIPT.search(node.value):
            return "starts a program that imports torch"
        if _DEMO.match(node.value):
            return "runs gpulse demo"
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "gpulse_cmd" and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and first.value == "demo":
            return "runs gpulse demo"
    if isinstance(node, ast.List):
        words = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        for command, reason in SLOW_COMMANDS.items():
            if set(command) <= words:
                return reason
    return None


def _reason(tree: ast.AST) -> str | None:
    """What slow thing ``tree`` (a statement, a function) uses, if any."""
    for node in ast.walk(tree):
        for name in _imports(node):
            if _is_slow_import(name):
                return f"imports {name}"
        if reason := _literal_reason(node):
            return reason
    return None


def _marks_slow(stmt: ast.stmt) -> bool:
    """``pytest.mark.slow`` (or ``mark.slow``) in a module-level statement."""
    return any(
        isinstance(n, ast.Attribute) and n.attr == "slow" and ast.unparse(n.value).endswith("mark")
        for n in ast.walk(stmt)
    )


def _tests(stmt: ast.stmt) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The test functions a module-level statement defines (a ``test_`` function, or those of a ``Test`` class)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name.startswith("test"):
        return [stmt]
    if isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
        return [f for f in stmt.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return []


@functools.cache
def lane(path: Path) -> Lane:
    """Where the tests of the file at ``path`` belong. What a test function uses puts that test out of the
    fast lane; what the rest of the module uses (its imports, helpers, fixtures, scripts) puts the whole file out."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    tests: dict[str, str] = {}
    for stmt in tree.body:
        defined = _tests(stmt)
        if defined:
            tests.update({f.name: r for f in defined if (r := _reason(f))})
        elif reason := _reason(stmt):
            return Lane(reason, {})
        elif _marks_slow(stmt) and not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return Lane("marked slow at module level", {})
    return Lane(None, tests)
