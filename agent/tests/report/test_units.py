"""Numbers in the reports read as people write them: durations, energy with prefixes, no exponents."""

from __future__ import annotations

import pytest

from gpulse.report import units


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(10260, "2 h 51 min"), (3590, "59 min 50 s"), (75.2, "1 min 15 s"), (42.4, "42 s"), (4.25, "4.25 s"),
     (0.0123, "0.0123 s"), (200_000, "2 d 7 h"), (None, "n/a")],
)  # fmt: skip
def test_a_duration_is_written_in_its_largest_units(seconds, text) -> None:
    assert units.duration(seconds) == text


def test_energy_carries_an_si_prefix_and_from_a_kwh_on_the_kwh() -> None:
    assert units.energy(5.6e6) == "5.6 MJ (1.6 kWh)"
    assert units.energy(12_000) == "12 kJ"
    assert units.energy(12.5) == "12.5 J"
    assert units.si(346_980, "J") == "346.98 kJ"


@pytest.mark.parametrize(
    ("value", "decimals", "text"),
    [(10260.4, 2, "10,260.4"), (1.026e4, 2, "10,260"), (510.3, 0, "510"), (0.5, 2, "0.5"),
     (0.00012345, 2, "0.00012"), (3, 2, "3"), (-3.5, 2, "-3.5"), (None, 2, "n/a")],
)  # fmt: skip
def test_a_number_has_separators_and_never_an_exponent(value, decimals, text) -> None:
    assert units.number(value, decimals) == text
