"""Grafana's own types and formatter check the generated dashboards (Grafana cannot run here).

Every dashboard becomes a ``.ts`` file typed by Grafana 13.2's generated types and passes
``tsc --strict --noEmit``; injected faults (a typo'd enum, a wrong option name, an annotation
without ``target``, ...) must each fail it. Every unit id is one ``@grafana/data`` knows, and a
sample of every panel column, formatted by Grafana's own ``getValueFormat``, reads back as the
quantity the column holds (see :func:`grafana_ts.misreads`). The same formatter shows what the old
dashboards did wrong (``short`` on pids and bytes, ``h`` on GPU-hours).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from grafana_ts import Diagnostic, dashboard_ts, ensure_installed, grafana, misreads, tsc, workdir

from gpulse.dashboards import dashboards, units
from gpulse.dashboards.builder import Panel

BUILT = dashboards()
DASHES = {d.slug: (d.path, d.to_json()) for d in BUILT}
NOW_MS = int(time.time() * 1000)
#: A typical value of each quantity, the kind of number a panel shows.
SAMPLES: dict[str, float] = {
    "id": 123456,
    "bytes": 2.15e9,
    "MHz": 1980,
    "ratio": 0.41,
    "percent": 87.456,
    "GPU-h": 192,
    "s": 0.245,
    "ms": 12.5,
    "W": 312.4,
    "°C": 71,
    "bytes/s": 1.2e10,
    "J": 120000,
    "kWh": 3.2,
    "count": 3,
    "P-state": 2,
    "gen": 4,
    "lanes": 16,
    "TFLOP/s": 312.5,
    "samples/s": 128.4,
    "tokens/s": 123456,
    "lines/s": 1234.5,
    "records/s": 20,
    "timestamp": NOW_MS - 120_000,
    "plain": 2.345,
}


@pytest.fixture(scope="module")
def harness() -> None:
    try:
        ensure_installed()
    except RuntimeError as e:
        pytest.fail(str(e))


def _check(files: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, list[Diagnostic]]:
    with workdir() as w:
        for name, (source, dash) in files.items():
            (w / f"{name}.ts").write_text(dashboard_ts(dash, source))
        diags = tsc(w)
    out: dict[str, list[Diagnostic]] = {name: [] for name in files}
    for d in diags:
        out.setdefault(d.file.removesuffix(".ts"), []).append(d)
    return out


def test_every_generated_dashboard_type_checks_against_grafanas_generated_types(harness: None) -> None:
    result = _check(DASHES)
    assert {name: [f"{d.line}: {d.message}" for d in ds] for name, ds in result.items() if ds} == {}


# -- injected faults --------------------------------------------------------------------------------
def _panels(dash: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] == kind]


def _typo_legend(d: dict[str, Any]) -> None:
    _panels(d, "timeseries")[0]["options"]["legend"]["placement"] = "botom"


def _typo_draw_style(d: dict[str, Any]) -> None:
    _panels(d, "timeseries")[0]["fieldConfig"]["defaults"]["custom"]["drawStyle"] = "lines"


def _option_name(d: dict[str, Any]) -> None:
    opts = _panels(d, "stat")[0]["options"]
    opts["colourMode"] = opts.pop("colorMode")


def _custom_name(d: dict[str, Any]) -> None:
    custom = _panels(d, "timeseries")[0]["fieldConfig"]["defaults"]["custom"]
    custom["fillOpacityy"] = custom.pop("fillOpacity")


def _missing_option(d: dict[str, Any]) -> None:
    del _panels(d, "stat")[0]["options"]["wideLayout"]


def _annotation_without_target(d: dict[str, Any]) -> None:
    del d["annotations"]["list"][1]["target"]


def _annotation_old_layout(d: dict[str, Any]) -> None:
    a = d["annotations"]["list"][1]
    target = a.pop("target")
    a.update(query=target["query"], textColumn=target["textColumn"], tagsColumn=target["tagsColumn"])


def _override_id(d: dict[str, Any]) -> None:
    for p in d["panels"]:
        for o in p.get("fieldConfig", {}).get("overrides", []):
            for prop in o["properties"]:
                if prop["id"] == "unit":
                    prop["id"] = "units"
                    return


def _transformation_option(d: dict[str, Any]) -> None:
    (processes,) = [p for p in _panels(d, "table") if p["title"] == "Processes"]
    processes["transformations"][0]["options"]["fields"]["pid"]["operation"] = "group"


def _matcher(d: dict[str, Any]) -> None:
    for p in d["panels"]:
        for o in p.get("fieldConfig", {}).get("overrides", []):
            if o["matcher"]["id"] == "byName":
                o["matcher"]["id"] = "byname"
                return


def _table_cell(d: dict[str, Any]) -> None:
    _panels(d, "table")[0]["fieldConfig"]["defaults"]["custom"]["cellOptions"]["type"] = "color-txt"


def _variable_sort(d: dict[str, Any]) -> None:
    d["templating"]["list"][0]["sort"] = 9


def _result_format(d: dict[str, Any]) -> None:
    _panels(d, "timeseries")[0]["targets"][0]["resultFormat"] = "timeseries"


FAULTS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("enum-typo-legend-placement", _typo_legend, r"botom"),
    ("enum-typo-draw-style", _typo_draw_style, r'"lines"'),
    ("wrong-option-name", _option_name, r"colourMode"),
    ("wrong-custom-field-config-name", _custom_name, r"fillOpacityy"),
    ("missing-required-option", _missing_option, r"wideLayout"),
    ("annotation-without-target", _annotation_without_target, r"'target' is missing"),
    ("annotation-in-the-old-top-level-layout", _annotation_old_layout, r'"query"'),
    ("wrong-override-property", _override_id, r"'units' does not exist"),
    ("wrong-transformation-option", _transformation_option, r'"group"'),
    ("wrong-matcher-id", _matcher, r'"byname"'),
    ("wrong-table-cell-type", _table_cell, r"color-txt"),
    ("variable-sort-out-of-range", _variable_sort, r"'9'"),
    ("target-result-format-typo", _result_format, r'"timeseries"'),
]


def test_the_type_check_catches_each_injected_fault(harness: None) -> None:
    source, node_dash = DASHES["node"]
    files = {"control": (source, node_dash)}
    for name, inject, _ in FAULTS:
        dash = copy.deepcopy(node_dash)
        inject(dash)
        assert dash != node_dash, name
        files[name] = (source, dash)
    result = _check(files)
    assert result["control"] == []
    for name, _, expected in FAULTS:
        messages = [d.message for d in result[name]]
        assert any(re.search(expected, m) for m in messages), f"{name} was not caught: {messages}"


def test_a_panel_type_without_generated_types_is_refused() -> None:
    _, dash = DASHES["node"]
    dash = copy.deepcopy(dash)
    dash["panels"][1]["type"] = "graph"  # Grafana's removed Angular graph panel
    with pytest.raises(ValueError, match="no generated Grafana types for panel type 'graph'"):
        dashboard_ts(dash, "node.json")


# -- units ------------------------------------------------------------------------------------------
def _panel_units(p: Panel) -> list[units.Unit]:
    return [q.unit for q in p.queries if q.unit is not None] + [c.unit for c in p.columns]


def _all_unit_ids() -> set[str]:
    ids = {u.id for d in BUILT for p in d.panels() for u in _panel_units(p)}
    for _, (_, dash) in DASHES.items():
        for p in dash["panels"]:
            fc = p.get("fieldConfig", {})
            if "unit" in fc.get("defaults", {}):
                ids.add(fc["defaults"]["unit"])
            ids |= {prop["value"] for o in fc.get("overrides", []) for prop in o["properties"] if prop["id"] == "unit"}
    return ids


def test_every_unit_id_is_one_grafanas_value_formats_know(harness: None) -> None:
    ids = sorted(_all_unit_ids() | {"bogus-unit"})
    answer = grafana("units", ids)
    recognised = set(answer["known"]) | set(answer["custom"])
    assert set(ids) - recognised == {"bogus-unit"}  # the control: an unknown id is reported


def test_a_sample_of_every_panel_column_formats_as_its_quantity_with_grafanas_formatter(harness: None) -> None:
    cases = [
        (f"{d.title} / {p.title} / {u.id}", u, SAMPLES[u.quantity])
        for d in BUILT
        for p in d.panels()
        for u in _panel_units(p)
    ]
    texts = grafana("format", [{"unit": u.id, "decimals": u.decimals, "value": v} for _, u, v in cases])
    wrong = {
        name: why for (name, u, v), text in zip(cases, texts, strict=True) if (why := misreads(u.quantity, v, text))
    }
    assert wrong == {}
    print("\n" + "\n".join(f"{name}: {text}" for (name, _, _), text in zip(cases, texts, strict=True)))


#: What the dashboards used before, on the values the issue names, and what each shows instead.
MISLEADING = [
    ("pid under short", "short", None, "id", 123456),
    ("memory under short", "short", None, "bytes", 2.15e9),
    ("SM clock under short", "short", None, "MHz", 1980),
    ("MFU under short", "short", None, "ratio", 0.41),
    ("GPU-hours under h", "h", None, "GPU-h", 192),
    ("write latency (ms) under short", "short", None, "ms", 12.5),
    ("seconds since last write under ms", "ms", None, "s", 45),
]


def test_the_formatter_check_catches_the_misleading_units_the_dashboards_had(harness: None) -> None:
    texts = grafana("format", [{"unit": u, "decimals": dec, "value": v} for _, u, dec, _, v in MISLEADING])
    assert texts[:5] == ["123 K", "2.15 Bil", "1.98 K", "0.410", "1.14 weeks"]  # the examples, from Grafana
    for (name, _, _, quantity, v), text in zip(MISLEADING, texts, strict=True):
        assert misreads(quantity, v, text), f"{name}: {text!r} was accepted"
