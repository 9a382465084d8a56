"""The HTML report's axes: ticks a step of 1, 2 or 5 × 10^n apart, every label at one precision
(issue 27, item 8: an axis read 0.003, 0.005, 0.007, 0.01, 0.013)."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from gpulse.report.svg import nice_ticks

SPANS = [(0.0, 0.013), (0.003, 0.013), (0.0, 100.0), (0.0, 1.0), (0.0, 7.3), (0.0, 12345.0), (-3.0, 3.0),
         (0.0, 2.4e-5), (0.0, 0.25), (17.5, 18.2), (5.0, 5.0)]  # fmt: skip


def test_the_axis_that_read_unevenly_now_reads_in_even_steps_at_one_precision() -> None:
    t = nice_ticks(0.0027, 0.0128)
    assert [t.label(v) for v in t.values] == ["0.000", "0.005", "0.010", "0.015"]


@pytest.mark.parametrize(("lo", "hi"), SPANS)
def test_ticks_cover_the_data_in_steps_of_one_two_or_five_times_a_power_of_ten(lo: float, hi: float) -> None:
    t = nice_ticks(lo, hi)
    v = t.values
    assert v[0] <= lo and v[-1] >= hi and 3 <= len(v) <= 11
    steps = {round(b - a, 12) for a, b in pairwise(v)}
    assert len(steps) == 1, v  # evenly spaced
    step = steps.pop()
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    assert round(mantissa, 9) in (1, 2, 5)


@pytest.mark.parametrize(("lo", "hi"), SPANS)
def test_every_label_of_an_axis_has_the_same_decimals_and_says_its_value(lo: float, hi: float) -> None:
    t = nice_ticks(lo, hi)
    labels = [t.label(v) for v in t.values]
    decimals = {len(x.partition(".")[2]) for x in labels}
    assert decimals == {t.decimals}, labels
    assert [float(x.replace(",", "")) for x in labels] == pytest.approx(t.values)
    assert len(set(labels)) == len(labels) and "-0" not in labels
