"""ms-swift integration: ``swift sft ... --external_plugins <this file> --callbacks gpulse``.

ms-swift trainers are Hugging Face ``Trainer`` subclasses, so the HF callback does the work. ms-swift
(4.x, read in ``ms_swift-4.6.0``) builds its callbacks from names: ``--callbacks name ...`` is
looked up in ``swift.callbacks.callbacks_map`` and each entry is instantiated as
``cls(args, trainer)`` in ``SwiftMixin._get_callbacks`` before ``HfTrainer.__init__``.
``--external_plugins path/plugin.py`` imports a file (under a generated module name,
``_swift_external_<sha256>``) before that, so a plugin can add entries to ``callbacks_map``.

:func:`plugin_path` is such a plugin file (``swift_plugin/gpulse_swift.py``, alone in its directory
because ms-swift puts that directory first on ``sys.path``): it calls :func:`register`, which adds
:class:`GpulseSwiftCallback` to ``callbacks_map`` as ``"gpulse"``. ``python -m gpulse.training.swift``
prints the path.
"""

from __future__ import annotations

import os
from typing import Any

from gpulse.training.hf import GpulseCallback

CALLBACK_NAME = "gpulse"


class GpulseSwiftCallback(GpulseCallback):
    """The HF callback with ms-swift's constructor signature ``(args, trainer)``."""

    def __init__(self, args: Any = None, trainer: Any = None, **run_kwargs: Any) -> None:
        super().__init__(**run_kwargs)
        self.args = args
        self.trainer = trainer


def register(callbacks_map: dict[str, Any] | None = None, name: str = CALLBACK_NAME) -> dict[str, Any]:
    """Add the gpulse callback to ms-swift's ``callbacks_map`` (imported from ``swift.callbacks`` by default)."""
    if callbacks_map is None:
        from swift.callbacks import callbacks_map
    callbacks_map[name] = GpulseSwiftCallback
    return callbacks_map


def plugin_path() -> str:
    """The file to pass to ``--external_plugins``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "swift_plugin", "gpulse_swift.py")


if __name__ == "__main__":
    print(plugin_path())
