"""The two cause tables of ``docs/channel.md``, from :data:`~gpulse.channel.validate.REJECT_CAUSES` and
:data:`~gpulse.channel.validate.DROP_CAUSES`.

The document carries them verbatim among its prose (``agent/tests/docs/`` checks it); run as
``python -m gpulse.docs.channel`` and paste the output there when a cause changes.
"""

from __future__ import annotations

from gpulse.channel.validate import DROP_CAUSES, REJECT_CAUSES


def causes_markdown() -> str:
    """The rejected-message table, then the dropped-value table."""
    out = ["| rejected message (`rejected_by_cause`) | why |", "| --- | --- |"]
    out += [f"| `{cause}` | {text} |" for cause, text in REJECT_CAUSES.items()]
    out += ["", "| dropped value (`values_dropped_by_cause`) | why |", "| --- | --- |"]
    out += [f"| `{cause}` | {text} |" for cause, text in DROP_CAUSES.items()]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(causes_markdown(), end="")
