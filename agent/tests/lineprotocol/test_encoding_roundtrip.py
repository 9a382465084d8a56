"""Arbitrary text through the encoder and a real InfluxDB 1.x, read back: it must come back equal.

String field values round-trip exactly (newlines become spaces, lone surrogates U+FFFD: line
protocol cannot carry either). Tag values, tag keys and field keys round-trip as
``stored_key(v)`` (``support/stored_text.py``; measurements too): InfluxDB's parser reads a
backslash before ``,`` ``=`` or space (or at the end) as an escape and there is no way to write a
literal backslash there (``\\\\`` is not collapsed to ``\\`` in keys), so the encoder writes ``/``
instead. Every other backslash, including one before ``"``, is stored as written: 1.6.7 showed that
the older rule of also replacing a backslash before ``"`` was unnecessary, and it was dropped.

Each example writes its whole list of values in one request, so each example costs one write.
"""

from __future__ import annotations

import itertools
import urllib.error

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.stored_text import cleaned, stored_key

from gpulse.lineprotocol.encode import Encoder, escape_key, escape_measurement

# every character, with the ones line protocol treats specially drawn often
CHARS = st.sampled_from(list("\\ ,=\"'\n\r\t#_") + ["\ud800"]) | st.characters()
TEXT = st.text(CHARS, max_size=16)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
_examples = itertools.count()


def write(server, body: str) -> None:
    try:
        server.write(body)
    except urllib.error.HTTPError as e:  # show InfluxDB's reason, not just "400"
        raise AssertionError(f"{e.code}: {e.read()!r} for {body!r}") from None


@SETTINGS
@given(st.lists(TEXT, min_size=1, max_size=40))
def test_tag_values_and_string_fields_come_back_equal(influxdb_module, texts):
    m = f"rt_values_{next(_examples)}"
    enc = Encoder(strict=False)
    write(influxdb_module, "".join(enc.encode(m, {"t": v}, {"i": i, "s": v}, i + 1) for i, v in enumerate(texts)))
    rows = influxdb_module.rows(f'SELECT * FROM "{m}" GROUP BY *')
    assert len(rows) == len(texts)
    for row in rows:
        v = texts[row["i"]]
        assert row["s"] == cleaned(v)
        assert (row.get("t") or "") == stored_key(v)  # an empty tag value is omitted


@SETTINGS
@given(st.lists(TEXT, min_size=1, max_size=20, unique_by=stored_key))
def test_tag_keys_field_keys_and_measurements_come_back_equal(influxdb_module, texts):
    n = next(_examples)
    m = f"rt_keys_{n}"
    body = "".join(
        f"{m},k{escape_key(v)}=x f{escape_key(v)}=1i {i + 1}\nM{escape_measurement(v)}_{n},t=x i=1i 1\n"
        for i, v in enumerate(texts)
    )
    write(influxdb_module, body)
    q = influxdb_module.query
    fields = {k for k, _ in q(f'SHOW FIELD KEYS FROM "{m}"', db="gpulse")["results"][0]["series"][0]["values"]}
    tags = {k for (k,) in q(f'SHOW TAG KEYS FROM "{m}"', db="gpulse")["results"][0]["series"][0]["values"]}
    assert fields == {"f" + stored_key(v) for v in texts}
    assert tags == {"k" + stored_key(v) for v in texts}
    names = {k for (k,) in q("SHOW MEASUREMENTS", db="gpulse")["results"][0]["series"][0]["values"]}
    assert {f"M{stored_key(v)}_{n}" for v in texts} <= names
