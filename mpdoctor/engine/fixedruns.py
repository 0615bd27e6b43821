"""The ordered fixed runs of a pattern: the cheap test that rules a line out before any
regular expression runs. Shared by the line matcher (str) and the big-log scan (bytes)."""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T", str, bytes)


def runs_in_order(text: T, runs: Sequence[Sequence[T]], start: int = 0, end: int | None = None) -> bool:
    """Whether text[start:end] holds every step of `runs` in order (a step: one of its
    alternatives). The earliest end among a step's alternatives keeps this exact."""
    stop = len(text) if end is None else end
    pos = start
    for step in runs:
        if len(step) == 1:
            i = text.find(step[0], pos, stop)
            if i < 0:
                return False
            pos = i + len(step[0])
            continue
        best = -1
        for alt in step:
            i = text.find(alt, pos, stop)
            if i >= 0 and (best < 0 or i + len(alt) < best):
                best = i + len(alt)
        if best < 0:
            return False
        pos = best
    return True
