"""The package's import rules, checked on the source so that breaking one fails the build.

The folder tree is the pipeline (``docs/architecture.md``); these rules keep the stages apart:

* the in-process training library (``gpulse.training``) imports only the channel contract
  (``gpulse.channel``) and itself: what runs inside a user's training process stays small and never
  pulls in the agent;
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


@pytest.mark.parametrize(("who", "allowed", "third_party_ok"), RULES, ids=[r[0] for r in RULES])
def test_a_stage_imports_only_what_its_rule_allows(who: str, allowed: tuple[str, ...], third_party_ok: bool) -> None:
    broken = []
    for name, path in MODULES.items():
        if not within(name, who):
            continue
        for imported in sorted(gpulse_imports(path)):
            if imported != "gpulse" and not within(imported, *allowed):
                broken.append(f"{name} imports {imported}")
        if not third_party_ok:
            broken += [f"{name} imports third-party {m}" for m in sorted(third_party(path))]
    assert not broken, f"{who} may import only {allowed}:\n" + "\n".join(broken)


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
