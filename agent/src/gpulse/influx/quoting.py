"""InfluxQL quoting, for every statement gpulse builds: a leaf, so a code generator that words a query
needs no HTTP stack."""

from __future__ import annotations


def quote_ident(name: str) -> str:
    """An InfluxQL identifier in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_string(value: str) -> str:
    """An InfluxQL string literal in single quotes."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
