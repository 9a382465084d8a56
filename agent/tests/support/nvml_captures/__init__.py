"""Recorded ``nvidia-smi -q`` outputs of real GPUs, read into the stand-in's GPU profiles.

Each ``*.txt`` holds the first GPU of one public capture, verbatim, under a two-line header that
names its source (repository, path, commit). :func:`read_capture` turns the indented
``Key : Value`` text into a flat ``{"Section/Sub/Key": "value"}`` dict, so a profile can say
``cap["FB Memory Usage/Total"]`` and a reader can find the same line in the file.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

HERE = Path(__file__).parent


@cache
def read_capture(name: str) -> dict[str, str]:
    """``{"path/of/key": "value"}`` of ``<name>.txt``; the header's source line is under ``"#source"``."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in (HERE / f"{name}.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("# Source:"):
            out["#source"] = line.removeprefix("# Source:").strip()
            continue
        if not line.strip() or line.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(":")
        if line.lstrip().startswith("GPU 0000"):  # "GPU 00000000:18:00.0": the section of one GPU
            stack = []
            out["Bus Id"] = line.strip().removeprefix("GPU ").strip()
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([k for _, k in stack] + [key.strip()])
        if sep and value.strip():
            out[path] = value.strip()
        else:
            stack.append((indent, key.strip()))
    return out


def number(text: str) -> float:
    """The leading number of ``"81559 MiB"``, ``"100.89 W"``, ``"16x"``, ``"0x18"``."""
    head = text.split()[0].rstrip("x")
    return float(int(head, 16)) if head.lower().startswith("0x") else float(head)
