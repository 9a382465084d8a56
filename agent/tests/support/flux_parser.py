"""InfluxData's Flux parser (the WebAssembly build in ``tests/flux``), from Python.

The InfluxDB 2.x stand-in parses every task script with it, as InfluxDB does with
``fluxlang.DefaultService.Parse`` (``query/fluxlang/service.go``: ``parser.ParseSource``, then the
first error ``ast.Check`` finds), and tests read the generated Flux through its AST instead of
matching text. The parser is the Rust one (``libflux``) that Flux's Go ``parser.ParseSource`` calls,
so syntax errors are the server's own. Node and npm are required, as for ``tests/test_flux.py``;
``npm ci --prefix tests/flux`` installs the pinned package when it is missing.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

from .fixtures import REPO

HARNESS = REPO / "tests" / "flux"
PACKAGE = HARNESS / "node_modules" / "@influxdata" / "flux-lsp-browser" / "package.json"


class FluxToolMissing(RuntimeError):
    """node/npm or the pinned package is missing and cannot be installed; the message says how to fix it."""


def ensure_installed() -> str:
    """The ``node`` executable, with the pinned parser package installed next to the harness."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise FluxToolMissing("node and npm are needed to parse Flux (apt-get install nodejs npm); they are missing")
    if not PACKAGE.exists():
        r = subprocess.run(
            [npm, "ci", "--prefix", str(HARNESS), "--no-audit", "--no-fund"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if r.returncode != 0:
            raise FluxToolMissing(f"`npm ci --prefix tests/flux` failed (needs the npm registry):\n{r.stderr[-2000:]}")
    return node


@functools.lru_cache(maxsize=256)
def _parse_json(src: str) -> str:
    r = subprocess.run(
        [ensure_installed(), str(HARNESS / "ast.mjs")], input=src, capture_output=True, text=True, timeout=60
    )
    if r.returncode != 0:
        raise FluxToolMissing(f"tests/flux/ast.mjs failed (rc {r.returncode}): {r.stderr[-2000:]}")
    return r.stdout


def parse(src: str) -> dict[str, Any]:
    """The AST of a Flux file, as the parser's JSON (``{"type": "File", "body": [...]}``)."""
    return json.loads(_parse_json(src))


def nodes(tree: Any) -> Iterator[dict[str, Any]]:
    """Every AST node, depth first."""
    if isinstance(tree, dict):
        yield tree
        for value in tree.values():
            yield from nodes(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from nodes(item)


def errors(tree: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(node, message) of every error, in source order: the parser's, then what Go's ``ast.Check``
    (flux ``ast/check.go``) adds to the parsed tree before InfluxDB accepts it (a binary expression
    without an operator, a pipe without a call, an object mixing implicit and explicit properties)."""
    out = []
    for n in nodes(tree):
        out += [(n, e["msg"]) for e in n.get("errors") or []]
        kind = n.get("type")
        if kind == "BinaryExpression":
            if not n.get("left"):
                out.append((n, "missing left hand side of expression"))
            if not n.get("right"):
                out.append((n, "missing right hand side of expression"))
            if n.get("operator") in (None, "", "<INVALID_OP>"):  # Go: Operator == InvalidOperator (0)
                out.append((n, "expected an operator between two expressions"))
        elif kind == "PipeExpression" and not n.get("call"):
            out.append((n, "pipe destination is missing"))
        elif kind == "ObjectExpression":
            props = n.get("properties") or []
            if any(p.get("value") is None for p in props) and any(p.get("value") is not None for p in props):
                out.append((n, "cannot mix implicit and explicit properties"))
    return out


def syntax_errors(tree: dict[str, Any]) -> list[str]:
    """The messages of :func:`errors` (``ast.GetError`` reports the first)."""
    return [msg for _, msg in errors(tree)]


def assignments(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Top-level ``name = expression`` statements: name -> the expression node."""
    out = {}
    for st in tree.get("body") or []:
        if st.get("type") == "VariableAssignment":
            out[st["id"]["name"]] = st["init"]
    return out


def options(tree: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The ``option <name> = ...`` statements' expressions (several when the script repeats it)."""
    return [
        st["assignment"]["init"]
        for st in tree.get("body") or []
        if st.get("type") == "OptionStatement"
        and st["assignment"].get("type") == "VariableAssignment"
        and st["assignment"]["id"]["name"] == name
    ]


def properties(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An object expression's properties: key -> value node (the first one of a repeated key, as edit.GetProperty)."""
    out: dict[str, dict[str, Any]] = {}
    for p in obj.get("properties") or []:
        key = p["key"].get("name", p["key"].get("value"))
        out.setdefault(key, p["value"])
    return out


def source(node: dict[str, Any]) -> str:
    """The source text of a node."""
    return node["location"]["source"]


def calls(tree: dict[str, Any], function: str) -> list[dict[str, dict[str, Any]]]:
    """The keyword arguments of every call of ``function`` (``range``, ``date.sub``...), in source order."""
    out = []
    for n in nodes(tree):  # a piped call (``|> range(...)``) is a call node without a "type"
        if "callee" in n and source(n["callee"]) == function:
            args = n.get("arguments") or [{}]
            out.append(properties(args[0]))
    return out
