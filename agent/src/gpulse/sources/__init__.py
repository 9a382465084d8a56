"""Where points come from: NVML, simulated GPUs, training records."""
