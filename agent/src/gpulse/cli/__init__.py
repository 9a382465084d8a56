"""The ``gpulse`` command line: the dispatcher (``main``), one module per command (``commands``), and what
only commands use: ``doctor``, ``agent --check``, the demo scenario and the generated configuration doc."""
