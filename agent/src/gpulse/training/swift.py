"""Public entry of the ms-swift integration: ``python -m gpulse.training.swift`` prints the plugin file.

The integration lives in :mod:`gpulse.training.integrations.swift`; this path is the documented one.
"""

from gpulse.training.integrations.swift import GpulseSwiftCallback, plugin_path, register

__all__ = ["GpulseSwiftCallback", "plugin_path", "register"]

if __name__ == "__main__":
    print(plugin_path())
