"""A hang's per-rank stacks (faulthandler's dump, written by instrument/hang.py as
`stacks/rank<N>.txt`, or py-spy's): where each rank's main thread was, and whether it
was waiting in a collective."""

from __future__ import annotations

import re
from typing import Any

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                "broadcast", "barrier", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
                "send", "recv", "monitored_barrier", "wait")
_LIBRARY = ("site-packages", "dist-packages", "/lib/python3")


def read_stack(source: Any, limit: int = 256 * 1024) -> dict[str, Any] | None:
    try:
        with open(source.path, "rb") as fh:
            text = fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None
    return parse_stack(text)


def parse_stack(text: str) -> dict[str, Any] | None:
    """The main thread's frames (faulthandler prints the most recent call first):
    the user's innermost frame and the collective it is inside, if any."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    main = next((b for b in blocks if b.startswith("Current thread") and "MainThread" not in b), None)
    main = main or next((b for b in blocks if "Current thread" in b), blocks[-1] if blocks else "")
    frames = [m.groupdict() for m in (_FRAME.match(ln) for ln in main.splitlines()) if m]
    if not frames:
        return None
    collective = next((f["func"] for f in frames if f["func"] in _COLLECTIVES and
                       "distributed" in f["file"]), None)
    user = next((f for f in frames if not any(p in f["file"] for p in _LIBRARY)), frames[0])
    out = {"where": f"{user['file'].rsplit('/', 1)[-1]}:{user['line']} in {user['func']}", "frames": len(frames)}
    if collective:
        out["collective"] = collective
    return out
