"""Text that fits: wrapping that never cuts a URL, a command or a code span, widths in
screen cells, the one table renderer (plain, transposed or stacked; markdown tables),
sparklines and bars."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    pass

from ..findings import Finding
from ..redact import _Lazy  # a pattern compiled on first use

# --- wrapping that never cuts a URL, a command or a code span ---------------------------

# a unit: a run of non-spaces that may contain whole `code spans` (with their spaces)
_UNIT = _Lazy(r"(?:[^\s`]*`[^`\n]*`)+[^\s`]*|\S+")


def cells(text: str) -> int:
    """Terminal columns `text` takes (CJK characters take two)."""
    if text.isascii():
        return len(text)
    from unicodedata import combining, east_asian_width

    return sum(0 if combining(ch) else 2 if east_asian_width(ch) in "WF" else 1 for ch in text)


def _split_cells(unit: str, width: int) -> list[str]:
    """A long run of wide text (CJK prose has no spaces) cut into pieces of `width`
    columns; only for units with wide characters, never for a URL or a command."""
    pieces, cur, n = [], "", 0
    for ch in unit:
        w = cells(ch)
        if cur and n + w > width:
            pieces.append(cur)
            cur, n = "", 0
        cur += ch
        n += w
    return pieces + [cur] if cur else pieces


def wrap(text: str, width: int, indent: int = 0, first: str = "", rest: str | None = None) -> list[str]:
    """`text` as lines of at most `width` characters, broken at spaces only: a URL, a
    path or a `code span` is never cut (one longer than the line gets a line of its own
    and overflows it, which a terminal soft-wraps and copies whole). `first` prefixes the
    first line, `rest` (default: spaces as wide as `first`) the others, after `indent`."""
    pad = " " * indent
    rest = " " * len(first) if rest is None else rest
    lines: list[str] = []
    prefix = pad + first
    for para in text.split("\n"):
        units = _UNIT.findall(para)
        if not units:
            lines.append(prefix.rstrip())
            prefix = pad + rest
            continue
        cur = prefix
        empty = True
        room = max(10, width - len(pad + rest))
        expanded: list[str] = []
        for u in units:  # wide prose without spaces may break anywhere; code and URLs never
            expanded += _split_cells(u, room) if not u.isascii() and "`" not in u and cells(u) > room else [u]
        for u in expanded:
            if empty:
                if cells(cur) + cells(u) > width and cur.strip() and cur != prefix:
                    lines.append(cur.rstrip())
                    cur = pad + rest
                cur += u
                empty = False
            elif cells(cur) + 1 + cells(u) <= width:
                cur += " " + u
            else:
                lines.append(cur.rstrip())
                cur = pad + rest + u
            prefix = pad + rest
        lines.append(cur.rstrip())
        prefix = pad + rest
    return lines


def _pad(text: str, width: int, right: bool = False) -> str:
    fill = " " * max(0, width - cells(text))
    return fill + text if right else text + fill


def table_lines(cols: list[str], rows: list[list[str]], width: int, *, right: set[str] | frozenset = frozenset(),
                key: int = 0, transpose: bool = False) -> list[str]:
    """The one table layout of every face: a plain table (no box characters, no
    trailing spaces) when it fits in `width`; else, with `transpose` (a few rows of many
    short columns: the probe's modes), one column per row when that fits; otherwise
    stacked: each row's `key` cell on a line, then `  column: value` lines, so that no
    cell is ever truncated."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([cells(c)] + [cells(r[i]) for r in rows]) for i, c in enumerate(cols)]
    if sum(widths) + 2 * (len(cols) - 1) <= width:
        def fmt(line: list[str]) -> str:
            parts = [_pad(cell, w, col in right) for cell, w, col in zip(line, widths, cols)]
            return "  ".join(parts).rstrip()
        return [fmt(cols), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    if transpose and rows:
        names = [c for i, c in enumerate(cols) if i != key]
        flipped = [[r[i] for r in rows] for i in range(len(cols)) if i != key]
        head = [r[key] for r in rows]
        label = max(cells(c) for c in names)
        col_w = [max(cells(head[j]), *(cells(f[j]) for f in flipped)) for j in range(len(rows))]
        if label + sum(col_w) + 2 * len(rows) <= width:
            def line(first: str, values: list[str]) -> str:
                return (_pad(first, label) + "".join("  " + _pad(v, w, True) for v, w in zip(values, col_w))).rstrip()
            return [line("", head), line("", ["-" * w for w in col_w])] + [line(n, f) for n, f in zip(names, flipped)]
    label = max(len(c) for i, c in enumerate(cols) if i != key)
    out: list[str] = []
    for r in rows:
        out.append(r[key])
        for i, (c, cell) in enumerate(zip(cols, r)):
            if i != key:
                out += wrap(cell, width, indent=2, first=f"{c + ':':<{label + 1}} ")
    return out


def markdown_table(cols: list[str], rows: list[list[str]]) -> list[str]:
    """A GitHub markdown table (a `|` inside a cell escaped)."""
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [row(cols), "|" + "---|" * len(cols)] + [row(r) for r in rows]


def sparkline(values: list[float]) -> str:
    """▁▂▃▄▅▆▇█ for a series (the loss scale over steps): log-scaled when it spans
    more than a factor of 100, as loss scales do."""
    import math

    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]
    if not vals:
        return ""
    if min(vals) > 0 and max(vals) / min(vals) > 100:
        vals = [math.log2(v) for v in vals]
    lo, hi = min(vals), max(vals)
    bars = "▁▂▃▄▅▆▇█"
    if hi == lo:
        return bars[3] * len(vals)
    return "".join(bars[min(7, int((v - lo) / (hi - lo) * 8))] for v in vals)


def bar(fraction: float, width: int = 20) -> str:
    """A horizontal bar for a share in [0, 1] (headroom against a dtype's largest value)."""
    f = max(0.0, min(1.0, float(fraction)))
    full = int(f * width)
    return "█" * full + ("▌" if f * width - full >= 0.5 else "") + "·" * (width - full - (1 if f * width - full >= 0.5 else 0))


def _series(f: Finding) -> list[tuple[str, list[float]]]:
    """Numeric series a finding's facts carry (a run rule's `_scale_series`: the loss
    scale over the steps), drawn as a sparkline in the terminal and the markdown."""
    out = []
    facts = dict(f.all_facts or {})
    facts.update(f.facts)
    for k, v in facts.items():
        if isinstance(v, list) and len(v) >= 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            if "scale" in k or k.endswith("_series") or "loss" in k:
                out.append((k.lstrip("_").replace("_", " "), v))
    return out
