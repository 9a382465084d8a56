"""The agent process: its settings (``config``), the sampling loop (``loop``) and its live status line."""
