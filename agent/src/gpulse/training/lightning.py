"""Public import path of the PyTorch Lightning callback (``from gpulse.training.lightning import ...``).

The integration lives in :mod:`gpulse.training.integrations.lightning`; this path is the documented one.
"""

from gpulse.training.integrations.lightning import GpulseLightningCallback

__all__ = ["GpulseLightningCallback"]
