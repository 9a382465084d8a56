"""The package's import rules, checked on the source so that breaking one fails the build.

The folder tree is the pipeline (``docs/architecture.md``); these rules keep the stages apart:

* the in-process training library (``gpulse.training``) imports only the channel contract
  (``gpulse.channel``), the one definition of the int64 bounds (``gpulse.lineprotocol.limits``) and
  itself: what runs inside a user's training process stays small and never
  pulls in the agent. One exception, named in :data:`EXCEPTIONS` with its reason: the training
  process writes ``metrics_report.json`` at ``finish()`` with the report model ``gpulse report``
  uses (one summary, not two that drift apart). That is safe only while everything the training
  library can load stays standard-library code outside the agent's stages, which
  ``test_the_training_process_loads_only_standard_library_code_outside_the_agent`` checks on the
  whole import closure;
* the channel contract and the line protocol are leaves: the standard library, the schema and each
  other, nothing else (no third-party package either);
* sinks never import delivery: a sink writes one batch or raises; retries, spooling and dead letters
  are delivery's, and delivery depends on sinks, never the other way round.

Every import counts, also one inside a function: a lazy import still runs in the same process.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpulse"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


def imports_in(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, also inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GPULSE_MODULES = set(MODULES)


def gpulse_imports(path: Path) -> set[str]:
    """The gpulse modules (not names inside them) that ``path`` imports."""
    return {m for m in imports(path) if m in GPULSE_MODULES or m == "gpulse"}


def third_party(path: Path) -> set[str]:
    return {m for m in imports(path) if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "gpulse"}


def within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


RULES = [
    # (who, may import only these gpulse modules, third-party allowed)
    ("gpulse.training", ("gpulse.training", "gpulse.channel", "gpulse.lineprotocol.limits"), True),
    ("gpulse.channel", ("gpulse.channel", "gpulse.schema", "gpulse.lineprotocol"), False),
    ("gpulse.lineprotocol", ("gpulse.lineprotocol", "gpulse.schema"), False),
    ("gpulse.schema", ("gpulse.schema",), False),
]


#: (module, what it may import beyond its rule): why.
EXCEPTIONS = {
    ("gpulse.training.report", "gpulse.report.model"): (
        "metrics_report.json is written inside the training process at finish(), from the points the run "
        "kept, by the same report model `gpulse report` uses; it is pure computation, loaded only then"
    ),
    ("gpulse.training.report", "gpulse.report.text"): (
        "the summary rank 0 prints at finish() is the report's own text rendering (stdlib only), so the "
        "terminal and `gpulse report` say a run's numbers the same way"
    ),
}

#: What the training process may load, transitively: its own modules, the channel contract and the
#: leaves it stands on, and the report model of the exception above with what that needs
#: (``report.diagnose``, ``report.records`` and ``report.units``, standard-library modules).
TRAINING_CLOSURE = (
    "gpulse.training",
    "gpulse.channel",
    "gpulse.lineprotocol",
    "gpulse.schema",
    "gpulse.report.model",
    "gpulse.report.text",
    "gpulse.report.diagnose",
    "gpulse.report.records",
    "gpulse.report.units",
    "gpulse.report.host",
    "gpulse.report.phases",
)


@pytest.mark.parametrize(("who", "allowed", "third_party_ok"), RULES, ids=[r[0] for r in RULES])
def test_a_stage_imports_only_what_its_rule_allows(who: str, allowed: tuple[str, ...], third_party_ok: bool) -> None:
    broken = []
    for name, path in MODULES.items():
        if not within(name, who):
            continue
        for imported in sorted(gpulse_imports(path)):
            if imported != "gpulse" and not within(imported, *allowed) and (name, imported) not in EXCEPTIONS:
                broken.append(f"{name} imports {imported}")
        if not third_party_ok:
            broken += [f"{name} imports third-party {m}" for m in sorted(third_party(path))]
    assert not broken, f"{who} may import only {allowed}:\n" + "\n".join(broken)


def test_each_exception_is_still_needed() -> None:
    """An exception nobody uses any more is a hole in the rule: remove it."""
    unused = [pair for pair in EXCEPTIONS if pair[1] not in gpulse_imports(MODULES[pair[0]])]
    assert not unused


def closure(start: set[str]) -> set[str]:
    """Every gpulse module that importing ``start`` can load (lazy imports included)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen or name not in MODULES:
            continue
        seen.add(name)
        todo += gpulse_imports(MODULES[name])
        todo += [p for p in (name.rpartition(".")[0],) if p]  # a package's __init__ runs first
    return seen


def test_the_training_process_loads_only_standard_library_code_outside_the_agent() -> None:
    """Not only the training library's own imports: all they pull in, also through the exception."""
    loaded = closure({m for m in MODULES if within(m, "gpulse.training")})
    outside = sorted(m for m in loaded if m != "gpulse" and not within(m, "gpulse.training"))
    packages = {p.rpartition(".")[0] for p in TRAINING_CLOSURE}  # their __init__ runs too (checked below)
    assert [m for m in outside if not within(m, *TRAINING_CLOSURE) and m not in packages] == []
    assert [f"{m} imports {t}" for m in outside for t in sorted(third_party(MODULES[m]))] == []
    assert "gpulse.report.model" in outside  # the exception is what the closure covers


def test_sinks_never_import_delivery() -> None:
    broken = [
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if within(name, "gpulse.sinks")
        for imported in sorted(gpulse_imports(path))
        if within(imported, "gpulse.delivery")
    ]
    assert not broken, "\n".join(broken)


def test_the_checker_sees_a_lazy_and_a_relative_import() -> None:
    source = "def f():\n    from ..delivery import spool\n    import gpulse.lineprotocol.encode\n"
    found = imports_in(source, "gpulse.training")
    assert {"gpulse.delivery", "gpulse.delivery.spool", "gpulse.lineprotocol.encode"} <= found


# -- no import circle ---------------------------------------------------------------------------------
def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, also inside functions; not those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the else branch runs
                yield from _runtime_imports(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from _runtime_imports(node)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports at run time (lazy imports included, TYPE_CHECKING ones not).

    ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, and to ``pkg`` (its
    ``__init__``) only when ``name`` is not: Python loads the submodule, not a name of the package."""
    paths = {module_name_under(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in paths)
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in paths else base
                if target in paths:
                    edges.add(target)
        edges.discard(name)  # a package importing its own names is no circle
        graph[name] = edges
    return graph


def module_name_under(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & group):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group always has one


def test_no_import_circle_in_the_package() -> None:
    """A circle works only while its lazy import stays lazy; the stages depend one way."""
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_circle_check_sees_a_lazy_circle_and_not_a_type_checking_one(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")  # lazy, to a submodule
    (pkg / "b.py").write_text("import pkg.a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n")
    (pkg / "d.py").write_text("from pkg.c import x\n")
    (pkg / "sub" / "b.py").write_text("from pkg.sub import a\nB = 1\n")  # a submodule: no edge to sub/__init__
    (pkg / "sub" / "a.py").write_text("")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.c"] == set() and graph["pkg.sub.b"] == {"pkg.sub.a"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    (pkg / "sub" / "a.py").write_text("def g():\n    from pkg.sub import B\n")  # a name of sub/__init__
    assert sorted(import_cycles(import_graph(pkg))) == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.sub", "pkg.sub.b", "pkg.sub.a", "pkg.sub"],
    ]
