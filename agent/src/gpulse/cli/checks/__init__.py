"""The checks ``gpulse doctor`` and ``gpulse agent --check`` run: one :class:`~gpulse.cli.checks.base.Result`
type, one runner, and the checks grouped by what they look at (``gpus``, ``database``, ``local``).

``doctor`` runs them all against the node as it runs; ``agent --check`` runs the subset that says
whether this configuration would start (:mod:`gpulse.cli.doctor`, :mod:`gpulse.cli.agent_check`).
"""
