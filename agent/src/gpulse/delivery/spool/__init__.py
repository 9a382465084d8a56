"""The disk spool, one concept a module: ``codec`` (record format, checksums), ``layout`` (the folder's
files), ``damage`` (the walk over damaged records), ``store`` (the per-destination segment store),
``inspect`` (read-only, for ``gpulse doctor``/``status``) and ``claim`` (a spool belongs to its
destination). Callers import from here.
"""

from gpulse.delivery.spool.claim import HELD, claim_spool
from gpulse.delivery.spool.codec import HEADER, MAGIC, Record
from gpulse.delivery.spool.damage import Damage
from gpulse.delivery.spool.inspect import SpoolSummary, inspect_spool
from gpulse.delivery.spool.layout import ACK_FILE, DESTINATION_FILE, recorded_destination
from gpulse.delivery.spool.store import Appended, Spool

__all__ = [
    "ACK_FILE",
    "DESTINATION_FILE",
    "HEADER",
    "HELD",
    "MAGIC",
    "Appended",
    "Damage",
    "Record",
    "Spool",
    "SpoolSummary",
    "claim_spool",
    "inspect_spool",
    "recorded_destination",
]
