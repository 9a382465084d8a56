"""The downsampled tiers (``raw``, ``1m``, ``1h``) and their names: what setup, the probe's advice, the
downsampling plan and ``gpulse recompute`` all refer to, defined once.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulse.influx.durations import parse_duration


@dataclass(frozen=True)
class Tier:
    """One downsampled tier: where it reads, where it writes, how often, and how far back each run looks."""

    name: str  # retention policy name (1.x and DBRP) and bucket suffix (2.x)
    window: str  # aggregation window (InfluxQL/Flux duration literal)
    source: str  # name of the tier it is computed from
    retention: str  # default retention ("INF" = keep forever)
    every: str  # how often it runs: 2.x task `every`, 1.x `RESAMPLE EVERY`
    offset: str  # 2.x task delay after its scheduled time (the previous tier's run lands first)
    lookback: str  # each run re-aggregates this much history up to its scheduled time: the 2.x range, 1.x `FOR`


RAW = "raw"
RAW_RETENTION = "30d"
#: The 1m tier re-reads the last 6 h of raw points on every run: points that reach the raw bucket up to
#: about 6 h late (the spool replayed after an outage, a node whose clock runs late) and the windows of
#: failed runs are folded in by the next runs. The 1h tier re-reads 8 h of the 1m tier, so its last
#: rewrite of an hour comes after the 1m tier's last rewrite of that hour's minutes (see ``downsample._check_plan``).
TIERS: tuple[Tier, ...] = (
    Tier("1m", "1m", RAW, "400d", every="10m", offset="1m", lookback="6h"),
    Tier("1h", "1h", "1m", "INF", every="1h", offset="5m", lookback="8h"),
)
TIER_BY_NAME = {t.name: t for t in TIERS}
#: Every tier's name, the raw one first: one database (3.x), bucket (2.x) or retention policy (1.x) each.
ALL_TIERS: tuple[str, ...] = (RAW, *(t.name for t in TIERS))


def bucket_name(base: str, tier: str) -> str:
    """The 2.x bucket of a tier: ``gpulse`` for raw, ``gpulse_1m``, ``gpulse_1h``."""
    return base if tier == RAW else f"{base}_{tier}"


def task_name(tier: Tier, tenant: str | None = None) -> str:
    """``gpulse_raw_to_1m``; a tenant's tasks carry its name (``gpulse_vision_raw_to_1m``), as task names share the org."""
    return f"gpulse_{tenant + '_' if tenant else ''}{tier.source}_to_{tier.name}"


def cq_name(tier: Tier, measurement: str) -> str:
    return f"gpulse_{tier.name}_{measurement}"


def window_ns(tier: Tier) -> int:
    return parse_duration(tier.window)


def lookback_ns(tier: Tier) -> int:
    return parse_duration(tier.lookback)
