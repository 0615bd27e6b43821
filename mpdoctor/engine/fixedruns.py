"""The ordered fixed runs of a pattern: the cheap test that rules a line out before any
regular expression runs, and the step of them best to look for. Shared by the line
matcher (str) and the big-log scan (bytes)."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import Any, Sequence, TypeVar

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


# Words on nearly every line of a training log: a poor literal to look for.
COMMON_IN_LOGS = ("loss", "norm", "step", "epoch", "rank", "error", "warning", "train", "time",
                  "grad", "batch", "iter", "eval", "cuda", "torch", "memory", "tokens", "samples",
                  "grad_norm", "learning_rate", "throughput")


_COMMON_JOINED = "\x00".join(COMMON_IN_LOGS)
_LONGEST_COMMON = max(len(w) for w in COMMON_IN_LOGS) + 6


def is_common(step: Sequence[str]) -> bool:
    """Whether an alternative of the step is (part of) a word common in training logs, or
    that word with a few characters around it. (Asked for every pattern at each start of
    `explain`: one C-level search, and a word loop only for short alternatives.)"""
    for a in step:
        a = a.lower().strip()
        if a in _COMMON_JOINED:
            return True
        if len(a) < _LONGEST_COMMON and any(w in a and len(a) < len(w) + 6 for w in COMMON_IN_LOGS):
            return True
    return False


def best_step(rx: Any) -> tuple[str, ...] | None:
    """The fixed step of a pattern best to look for (`rx.runs`, in the pattern's case):
    no alternative shorter than 3 characters, none (part of) a word common in training
    logs if the pattern has such a step, then the longest shortest alternative (the
    earliest of equals). Every match of the pattern holds one of its alternatives; None
    when no step qualifies."""
    steps = [(-min(len(a) for a in step), k, step) for k, step in enumerate(getattr(rx, "runs", ()))
             if step and all(len(a.strip()) >= 3 for a in step)]
    if not steps:
        return None
    steps.sort()
    for _len, _k, step in steps:  # the longest first: is_common is asked once, mostly
        if not is_common(step):
            return step
    return steps[0][2]
