"""Every exit status of every command, in one place: ``--help`` epilogs and docs/configuration.md show these.

Each command module lists its own statuses in ``EXIT_CODES``; :data:`COMMON` are the ones
:func:`gpulse.cli.main.main` adds for every command (a usage or configuration error, Ctrl-C, a
closed output pipe). A test checks each module's ``return`` statements against its list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str


CONFIG_ERROR = 2
INTERRUPTED = 130
#: the reader of our output went away (``gpulse status | head -2``): a shell's SIGPIPE status
PIPE_CLOSED = 141

COMMON = (
    ExitCode(CONFIG_ERROR, "usage or configuration error: the message names the setting to correct"),
    ExitCode(INTERRUPTED, "interrupted (Ctrl-C)"),
    ExitCode(PIPE_CLOSED, "the output's reader went away (e.g. `| head`); the rest of the output was dropped"),
)


def all_codes(own: Iterable[ExitCode]) -> list[ExitCode]:
    """A command's own statuses and the common ones, by code (a command's own meaning of a code wins)."""
    by_code = {c.code: c for c in COMMON}
    by_code.update((c.code, c) for c in own)
    return [by_code[k] for k in sorted(by_code)]


def epilog(own: Iterable[ExitCode]) -> str:
    """The ``--help`` epilog: one line per exit status."""
    rows = all_codes(own)
    return "exit status:\n" + "\n".join(f"  {c.code:>3}  {c.meaning}" for c in rows)


def markdown(own: Iterable[ExitCode]) -> list[str]:
    """The same as a Markdown table (docs/configuration.md)."""
    return ["| exit status | meaning |", "| --- | --- |", *(f"| {c.code} | {c.meaning} |" for c in all_codes(own))]
