"""A hang's per-rank stacks (faulthandler's dump, written by instrument/hang.py as
`stacks/rank<N>.txt`, or py-spy's): where each rank's main thread was, and whether it
was waiting in a collective."""

from __future__ import annotations

import re
from typing import Any

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                "broadcast", "barrier", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
                "send", "recv", "monitored_barrier", "wait")
_LIBRARY = ("site-packages", "dist-packages", "/lib/python3", "/mpdoctor/instrument/", "<frozen ")


def read_stack(source: Any, limit: int = 256 * 1024) -> dict[str, Any] | None:
    try:
        with open(source.path, "rb") as fh:
            text = fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None
    return parse_stack(text)


_MARK = re.compile(r"^# mpdoctor: rank \S+ main thread (0x[0-9a-f]+) \((?P<why>[^)]*)\)", re.M)


def parse_stack(text: str) -> dict[str, Any] | None:
    """The main thread's frames (faulthandler prints the most recent call first) of the
    first dump in the file (where the rank was when the first rank gave up): the user's
    innermost frame and the collective it is inside, if any."""
    marks = list(_MARK.finditer(text))
    for i, m in enumerate(marks or [None]):
        start = m.end() if m else 0
        end = marks[i + 1].start() if m and i + 1 < len(marks) else len(text)
        found = _parse_dump(text[start:end], m.group(1) if m else None)
        if found is not None:
            if m:
                found["why"] = m.group("why")
            return found
    return None


def _parse_dump(text: str, main_id: str | None) -> dict[str, Any] | None:
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text.strip()) if b]
    main = next((b for b in blocks if main_id and b.split("(", 1)[0].strip().endswith(main_id)), None)
    main = main or next((b for b in blocks if b.startswith("Current thread")), blocks[-1] if blocks else "")
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
