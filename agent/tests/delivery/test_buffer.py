"""Cutting lines into batches: one rule (``batched``) for the agent's buffer and for one-shot uploads."""

from __future__ import annotations

from gpulse.delivery.buffer import LineBuffer, batched


def test_batches_close_at_the_line_count_or_before_the_byte_limit_and_a_long_line_stands_alone():
    lines = ["aaaa\n"] * 7 + ["x" * 30 + "\n"] + ["bb\n"] * 2
    got = list(batched(iter(lines), max_lines=3, max_bytes=12))
    assert got == [["aaaa\n"] * 2, ["aaaa\n"] * 2, ["aaaa\n"] * 2, ["aaaa\n"], ["x" * 30 + "\n"], ["bb\n"] * 2]
    assert [line for b in got for line in b] == lines


def test_batched_reads_lazily_one_line_past_a_batch():
    seen: list[int] = []

    def source():
        for i in range(100):
            seen.append(i)
            yield f"{i}\n"

    first = next(batched(source(), max_lines=10, max_bytes=1 << 20))
    assert len(first) == 10 and len(seen) == 11


def test_the_buffer_cuts_full_batches_and_keeps_the_remainder_until_forced():
    buf = LineBuffer(max_lines=4, max_bytes=1 << 20, hard_max_bytes=1 << 20, epoch=5)
    ticket, full = buf.add([f"{i}\n" for i in range(10)])
    assert (ticket, full) == (10, True)
    cut = buf.cut(force=False)
    assert [(b.start, b.end, b.epoch) for b in cut] == [(0, 4, 5), (4, 8, 5)]
    assert buf.lines == 2 and buf.cut_upto == 8
    rest = buf.cut(force=True)
    assert [(b.start, b.end, b.lines) for b in rest] == [(8, 10, ["8\n", "9\n"])]
    assert buf.cut(force=True) == [] and buf.lines == 0
