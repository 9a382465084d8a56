"""gpulse: GPU training, made visible.

The package is laid out as the pipeline it implements: ``sources`` (NVML, simulated GPUs,
training records) -> ``encoding`` (line protocol, typed by ``schema``) -> ``buffer`` and
``spool`` -> ``sinks`` (InfluxDB v2, v1, recording file). ``training`` is the in-process library
for training scripts; it imports nothing but the standard library at import time.
"""

__version__ = "0.1.0"
