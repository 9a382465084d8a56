"""Run reports: metrics (``model``), findings (``diagnose``), HTML (``html``) and loading (``load``)."""
