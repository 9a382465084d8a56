"""Which measurements and identifiers an InfluxQL query names (the dashboards' docs list them).

A query never names the database: the datasource's ``dbName`` is the bucket the user configured
(``GPULSE_BUCKET``), so ``FROM "1h"."gpu"`` follows it and ``FROM "gpulse"."1h"."gpu"`` would break
for any other name; :func:`references` refuses the latter. The checks of these names against
:mod:`gpulse.schema` run in the tests (``agent/tests/support/influxql_checks.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SOURCE = re.compile(r'\bFROM\s+((?:"[^"]+"\.){0,2}"[^"]+")', re.IGNORECASE)
_ALIAS = re.compile(r'\bAS\s+"([^"]+)"', re.IGNORECASE)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'")
_REGEX = re.compile(r"=~\s*/(?:[^/\\]|\\.)*/|!~\s*/(?:[^/\\]|\\.)*/")
_IDENT = re.compile(r'"([^"]+)"')


@dataclass
class References:
    #: (retention policy or None for the default, measurement)
    sources: list[tuple[str | None, str]] = field(default_factory=list)
    identifiers: set[str] = field(default_factory=set)
    aliases: set[str] = field(default_factory=set)


def references(query: str) -> References:
    """The measurements, field/tag identifiers and aliases an InfluxQL query names (all double-quoted)."""
    refs = References()
    for m in _SOURCE.finditer(query):
        parts = _IDENT.findall(m.group(1))
        if len(parts) == 3:
            raise ValueError(f"query names the database {parts[0]!r}; name only the retention policy: {query}")
        rp = parts[-2] if len(parts) >= 2 else None
        refs.sources.append((rp, parts[-1]))
    refs.aliases = set(_ALIAS.findall(query))
    rest = _SOURCE.sub(" ", query)
    rest = _ALIAS.sub(" ", rest)
    rest = _STRING.sub(" ", rest)
    rest = _REGEX.sub(" ", rest)
    refs.identifiers = set(_IDENT.findall(rest))
    return refs
