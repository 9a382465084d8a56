"""Numbers as people read them, shared by the text and HTML reports: "2 h 51 min", "5.6 MJ", "10,260".

Never scientific notation: a report reader should not have to decode ``1.026e+04``.
"""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    """``10260`` -> ``2 h 51 min``; ``75.2`` -> ``1 min 15 s``; ``4.25`` -> ``4.25 s``."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:.0f} s"
    s = round(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {s} s"


_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float | None, unit: str, digits: int = 2) -> str:
    """``5.6e6, "J"`` -> ``5.6 MJ``: an SI prefix and ``digits`` significant decimals at most."""
    if value is None or not math.isfinite(value):
        return "n/a"
    for factor, prefix in _SI:
        if abs(value) >= factor:
            return f"{_trim(value / factor, digits)} {prefix}{unit}"
    return f"{_trim(value, digits)} {unit}"


def energy(joules: float | None) -> str:
    """Joules with a prefix and, from a kilowatt-hour on, the kWh figure people pay for."""
    if joules is None:
        return "n/a"
    kwh = joules / 3.6e6
    return si(joules, "J", 1) + (f" ({number(kwh, 1)} kWh)" if kwh >= 1 else "")


def number(value: float | int | None, decimals: int = 2) -> str:
    """Thousands separated, at most ``decimals`` decimals, no exponent: ``10260.4`` -> ``10,260.4``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    if 0 < abs(value) < 10 ** (-decimals):  # tiny: two significant digits, not 0.00
        decimals = 1 - math.floor(math.log10(abs(value)))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def percent(ratio: float | None, digits: int = 1) -> str:
    return "n/a" if ratio is None else f"{100 * ratio:.{digits}f}%"


def _trim(v: float, digits: int) -> str:
    return number(v, digits) if abs(v) < 1000 else f"{v:,.0f}"
