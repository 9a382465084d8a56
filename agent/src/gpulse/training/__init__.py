"""gpulse.training: per-step training metrics, sent to the node's gpulse agent.

``from gpulse.training import Run`` imports only the standard library: torch is looked up in
``sys.modules`` when needed (never imported here), the line-protocol encoder only when a recording
file must be written, and framework integrations live in their own modules
(``gpulse.training.hf``, ``.lightning``, ``.swift``, ``.comm``). The library's own modules import
each other directly (``gpulse.training.run``, ...), never this package, so that it is no link in a
circle of imports.
"""

from __future__ import annotations

from gpulse.training.run import Run

__all__ = ["Run"]
