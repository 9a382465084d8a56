"""GPUs through NVML (``nvidia-ml-py``): the source, its support probe, GPM, events, processes, and errors."""
