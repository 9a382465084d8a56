"""``gpulse setup``: the database layout, for InfluxDB 3 (``v3``), 2.x (``v2``) and 1.x (``v1``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulse.influx.connection import Connection


def downsample_now(conn: Connection, start_ns: int, end_ns: int) -> None:
    """Downsample ``[start, end)`` into the 1m and 1h tiers now, the way ``conn``'s API does it: 1.x the
    continuous queries' ``SELECT ... INTO``, 2.x the tasks' Flux, 3.x the plugin's ``request:`` trigger
    (``gpulse recompute``, ``gpulse demo``, ``gpulse setup --run-downsampling``)."""
    if conn.api == "v1":
        from gpulse.influx.setup.v1 import downsample_now as run
    elif conn.api == "v3":
        from gpulse.influx.setup.v3 import downsample_now as run  # type: ignore[assignment]
    else:
        from gpulse.influx.setup.v2 import downsample_now as run  # type: ignore[assignment]
    run(conn, start_ns, end_ns)
