"""The sink interface: one synchronous write of a batch of lines, or a classified :class:`WriteError`."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from gpulse.sinks.errors import ErrorKind, WriteError

__all__ = ["ErrorKind", "Sink", "WriteError", "encode_body"]


class Sink(abc.ABC):
    """Where batches go. ``write`` either takes every line or raises :class:`WriteError`; it never retries
    (the delivery owns retries, spooling and dead letters) and is called by one thread at a time."""

    #: stable and filesystem-safe: names the sink's spool subdirectory, so a restart finds its backlog
    name: str = "sink"
    #: a database (its counts are the agent's ``lines_written``), as opposed to a local file
    is_database: bool = True

    @abc.abstractmethod
    def write(self, lines: Sequence[str]) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and files."""

    def describe(self) -> str:
        return self.name


def encode_body(lines: Sequence[str]) -> bytes:
    """The request body: the lines, UTF-8 (each line already ends with a newline)."""
    return "".join(lines).encode("utf-8", "replace")
