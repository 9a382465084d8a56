"""gpulse.training: per-step training metrics, sent to the node's gpulse agent.

``from gpulse.training import Run`` imports only the standard library: torch is looked up in
``sys.modules`` when needed (never imported here), the line-protocol encoder only when a recording
file must be written, and framework integrations live in their own modules
(``gpulse.training.integrations.hf``, ``.lightning``, ``.swift``, ``.comm``).
"""

from __future__ import annotations

from gpulse.training.run import Run

__all__ = ["Run"]
