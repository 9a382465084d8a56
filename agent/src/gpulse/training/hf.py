"""Public import path of the Hugging Face ``Trainer`` callback (``from gpulse.training.hf import GpulseCallback``).

The integration lives in :mod:`gpulse.training.integrations.hf`; this path is the documented one.
"""

from gpulse.training.integrations.hf import GpulseCallback

__all__ = ["GpulseCallback"]
