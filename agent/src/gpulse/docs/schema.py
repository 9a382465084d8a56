"""``docs/schema.md``: the data model (:mod:`gpulse.schema`) as a reader sees it.

``gpulse schema`` prints it and ``make generate`` writes it; ``agent/tests/docs/`` fails when the
file differs. Run as ``python -m gpulse.docs.schema``.
"""

from __future__ import annotations

from gpulse.schema import MEASUREMENTS


def render_markdown() -> str:
    """``docs/schema.md``: the data model as a reader sees it."""
    out = [
        "# gpulse data model",
        "",
        "Generated from `agent/src/gpulse/schema.py` by `gpulse schema` (`make generate`); a test fails when this file differs.",
        "",
        "Types are InfluxDB line-protocol types: `int` is written with the `i` suffix (never `u`), `float` as a decimal.",
        "Kinds: **gauge** fields are downsampled to mean (same name) plus `_max` and `_min`; **counter** fields to "
        "`last` (derive rates at query time); **info** fields are not downsampled.",
        "",
    ]
    for m in MEASUREMENTS.values():
        out += [f"## `{m.name}`", "", m.doc, ""]
        tags = ", ".join(f"`{t}`" for t in m.tags)
        if m.optional_tags:
            tags += " (optional: " + ", ".join(f"`{t}`" for t in m.optional_tags) + ")"
        if m.max_extra_tags:
            tags += f"; up to {m.max_extra_tags} user tags"
        out += [f"Tags: {tags}", ""]
        if m.open_fields:
            out += [f"Extra float fields matching `{m.open_fields}` are accepted.", ""]
        out += [f"Downsampled: {'yes' if m.downsampled else 'no'}", ""]
        out += ["| field | type | unit | kind | meaning |", "| --- | --- | --- | --- | --- |"]
        for f in m.fields:
            out.append(f"| `{f.name}` | {f.type} | {f.unit} | {f.kind} | {f.doc} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render_markdown(), end="")
