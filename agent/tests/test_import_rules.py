"""The package's import rules, checked on the source so that breaking one fails the build.

The folder tree is the pipeline (``docs/architecture.md``); these rules keep the stages apart:

* the in-process training library (``gpulse.training``) imports only the channel contract
  (``gpulse.channel``) and itself: what runs inside a user's training process stays small and never
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
    ("gpulse.training", ("gpulse.training", "gpulse.channel"), True),
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
}

#: What the training process may load, transitively: its own modules, the channel contract and the
#: leaves it stands on, and the report model of the exception above with what that needs
#: (``report.diagnose`` and ``report.records``, standard-library modules).
TRAINING_CLOSURE = (
    "gpulse.training",
    "gpulse.channel",
    "gpulse.lineprotocol",
    "gpulse.schema",
    "gpulse.report.model",
    "gpulse.report.diagnose",
    "gpulse.report.records",
    "gpulse.report.host",
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
