"""Lines a hard wrap cut, joined again: a paste wrapped at a fixed width, a word split
in two. A join is only ever a second chance for a rule that matched neither line alone."""

from __future__ import annotations

from ..logtext import LazyRe, LogLine

# A line cut by a hard wrap: what does not start a line of its own.
_NEW_THING = LazyRe(r"^(?:File \"|Traceback \(|During handling|The above exception|\[?[\w.]{0,60}(?:Error|Exception|Warning)\b|"
                        r"\d{4}-\d\d-\d\d|\[rank\d|#\d+ |[-=*#|>]{2})")
_ENDS_WORD = LazyRe(r"[A-Za-z0-9_]$")
MAX_JOIN = 3
# Up to this much text (a paste: a GitHub comment holds 64K characters) every line may
# be a wrap's; in more, only the lines next to a rule's literal.
PASTE_CHARS = 64 * 1024


def wrap_width(lines: list[LogLine]) -> int | None:
    """The column a paste was hard-wrapped at, when it was: at least three lines end
    within a word's length of the longest one, and that is 40-300 characters."""
    lengths = [len(ln.raw or ln.text) for ln in lines if ln.text]
    if len(lengths) < 3:
        return None
    width = max(lengths)
    if not 40 <= width <= 300:
        return None
    near = sum(1 for n in lengths if n >= width - 12)
    return width if near >= 3 else None


def wrap_joins(lines: list[LogLine], near: set[int] | None = None) -> list[LogLine]:
    """The logical lines a hard wrap may have cut, joined again (each join twice: with a
    space, as a wrap at a space; and without, as a word split in two). They keep the
    first line's number, so that evidence points at where the message starts. `near`:
    only the joins that take in one of these line indices (None: every line)."""
    width = wrap_width(lines)
    out: list[LogLine] = []
    starts: range | list[int] = range(len(lines) - 1)
    if near is not None:
        starts = sorted({i for n in near for i in range(n - MAX_JOIN + 1, n + 1) if 0 <= i < len(lines) - 1})
    for i in starts:
        group = [lines[i]]
        for j in range(i + 1, min(i + MAX_JOIN, len(lines))):
            a, b = group[-1], lines[j]
            if not _wrapped(a, b, width):
                break
            group.append(b)
            for sep in (" ", ""):
                text = sep.join(x.text.strip() if k else x.text.rstrip() for k, x in enumerate(group))
                raw = " ".join((x.raw or x.text).strip() for x in group)
                out.append(LogLine(group[0].no, text, group[0].rank, raw, group[0].stream))
                if not (_ENDS_WORD.search(a.text) and b.text[:1].isalnum()):
                    break  # not cut inside a word: the spaced join is the only one
    return out


_EXCEPTION_START = LazyRe(r"^[\w.]{0,80}(?:Error|Exception|Warning)\b:? ")


def _wrapped(a: LogLine, b: LogLine, width: int | None) -> bool:
    """Could `b` be the rest of `a`, cut by a wrap? (A join is only ever a second chance
    for a rule that matched neither line alone.)"""
    if b.no != a.no + 1 or a.stream != b.stream or (b.rank is not None and b.rank != a.rank):
        return False
    at, bt = a.text.rstrip(), b.text.strip()
    if len(at) < 20 or not bt or _NEW_THING.match(bt):
        return False
    if width is not None and len(a.raw or a.text) >= width - 30:
        return True  # a paste wrapped at a fixed column (at a space: the next word did not fit)
    if _EXCEPTION_START.match(at):
        return True  # an exception's message continued on the next line
    # a word cut in two at the end of a long line ("collective opera" / "tion timeout")
    return len(at) >= 40 and bool(_ENDS_WORD.search(at)) and bt[:1].islower()
