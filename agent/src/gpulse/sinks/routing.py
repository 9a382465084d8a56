"""Tenants: a job's points go to its team's bucket, the node's own samples stay in the fleet's.

A :class:`Router` names the tenant of a line: a job-level point (:data:`JOB_MEASUREMENTS`: GPU
processes, the host's processes, training points) whose Slurm ``account`` or Kubernetes
``namespace`` tag matches a route belongs to that route's tenant. The agent tags a training rank's
points with the ``account`` of its process (``channel/server.py``, from the kernel), so they are
routed from the run's first point; a rank with no account there (a pod: its namespace comes from the
kubelet with its GPU) is routed by its ``job``, which the router learns from the job's process points,
and its points that pass before the first of those stay with the fleet. The agent's samples of a
training process (``host_process``) carry its rank's job and account too. A job no route names is
the fleet's, as is everything else (``gpu``, ``host``, ``agent``, ``gpu_event``...), for the operators.

Every sink is wrapped in a :class:`RoutedSink` that writes only its own lines. Each sink (the
fleet's and each tenant's) gets every batch and has its own spool, so one destination being down
loses nothing and never holds up another; the cost is that each spool also keeps the others' lines
(dropped when replayed).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpulse.lineprotocol.parse import LineError, parse_line
from gpulse.schema import GPU_PROCESS, HOST_PROCESS, TRAIN_EVENT, TRAIN_RUN, TRAIN_STEP
from gpulse.sinks.base import Sink, WriteError

#: The measurements that belong to a job, and so to its tenant.
JOB_MEASUREMENTS = frozenset(m.name for m in (GPU_PROCESS, HOST_PROCESS, TRAIN_STEP, TRAIN_RUN, TRAIN_EVENT))


#: Measurement and tags: up to the first space that is not escaped.
SERIES_KEY = re.compile(r"(?:[^ \\]|\\.)+")


@dataclass(frozen=True)
class TenantRoute:
    """``[[tenants.route]]``: a job of this Slurm account or in this Kubernetes namespace is ``tenant``'s."""

    tenant: str
    slurm_account: str | None = None
    k8s_namespace: str | None = None


class Router:
    """The tenant of each line (``None``: the fleet's). Stateful (it learns jobs): one per sink, fed in order."""

    def __init__(self, routes: Sequence[TenantRoute]) -> None:
        self.by_account = {r.slurm_account: r.tenant for r in routes if r.slurm_account}
        self.by_namespace = {r.k8s_namespace: r.tenant for r in routes if r.k8s_namespace}
        self.jobs: dict[str, str] = {}

    def tenant_of(self, line: str) -> str | None:
        return self._decide(self._tags(line), learn=True)

    def tenants_of(self, lines: Sequence[str]) -> list[str | None]:
        """The tenant of each line of a batch: the jobs it names are learnt first, then each line decided.

        So a job's training point before its first process point in the same batch goes with it, and a
        retried batch is decided as it was the first time (deciding line by line, a retry after the
        batch taught a job could send a point to the tenant that the fleet's sink had already written)."""
        tags = [self._tags(line) for line in lines]
        for t in tags:
            self._decide(t, learn=True)
        return [self._decide(t, learn=False) for t in tags]

    @staticmethod
    def _tags(line: str) -> dict[str, str] | None:
        """The tags of a job-level line, None for the others (node-level, or not parsable: the fleet's)."""
        head = line.split(" ", 1)[0]
        if head.split(",", 1)[0] not in JOB_MEASUREMENTS:  # cheap: most lines are node-level
            return None
        key = SERIES_KEY.match(line)
        try:  # the tags only: a line with a bad field still goes where its job's points go, to be refused there
            return parse_line(f"{key.group(0) if key else ''} _=0").tags
        except LineError:
            return None  # the fleet's sink reports it

    def _decide(self, tags: dict[str, str] | None, *, learn: bool) -> str | None:
        if tags is None:
            return None
        tenant = self.by_account.get(tags.get("account", "")) or self.by_namespace.get(tags.get("namespace", ""))
        job = tags.get("job")
        if tenant is not None and job and learn:
            self.jobs[job] = tenant
        elif tenant is None and job:
            tenant = self.jobs.get(job)
        return tenant


class RoutedSink(Sink):
    """``inner``, given only the lines of ``tenant`` (``None``: the fleet's lines)."""

    def __init__(self, inner: Sink, routes: Sequence[TenantRoute], tenant: str | None) -> None:
        self.inner, self.tenant, self.router = inner, tenant, Router(routes)
        self.name = inner.name if tenant is None else f"{inner.name}-tenant-{tenant}"
        # The fleet's sink takes every line once (writes it, or leaves it to a tenant's sink): its count is the
        # agent's lines_written, and a tenant's sink adds none (else each line would count once per sink).
        self.is_database = inner.is_database and tenant is None

    def write(self, lines: Sequence[str]) -> None:
        mine = [i for i, tenant in enumerate(self.router.tenants_of(lines)) if tenant == self.tenant]
        if not mine:
            return
        try:
            self.inner.write([lines[i] for i in mine])
        except WriteError as e:  # its line numbers are of the lines sent: make them the batch's
            e.bad_lines = tuple(mine[j] for j in e.bad_lines if 0 <= j < len(mine))
            e.line_errors = {mine[j]: why for j, why in e.line_errors.items() if 0 <= j < len(mine)}
            raise

    def close(self) -> None:
        self.inner.close()

    def describe(self) -> str:
        return self.inner.describe() + (f" for tenant {self.tenant}" if self.tenant else "")
