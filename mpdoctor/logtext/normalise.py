"""From physical lines to clean logical lines: rich boxes unwrapped, wrapped lines
rejoined, tracebacks glued onto progress bars split off, flattened ones unflattened,
JSON-escaped ones unescaped, interleaved writers kept apart. `normalise()` is the entry."""

from __future__ import annotations

import re

from .clean import (
    _PROGRESS,
    _RICH_HANDLER,
    _strip_prefixes,
    clean_physical_line,
    split_after_progress,
    split_overwrites,
)
from .lines import _HEAD, LazyRe, LogLine

# Rich box borders (rich.traceback, rich logging with tracebacks, typer, accelerate).
# The top border "╭──── Traceback ────╮" is read by _box_title with str methods: a
# regular expression for it (─*\s*(.*?)\s*─*) backtracks cubically on "╭" + spaces.
_BOX_CORNERS = ("╭┏╔", "╮┓╗")


_BOX_TOP_ASCII = LazyRe(r"^\s*\+-+ ?(?P<title>Traceback \(most recent call last\)) ?-+\+\s*$")


_BOX_BOTTOM = LazyRe(r"^\s*(?:[╰┗╚][─━═]*[╯┛╝]|\+-{10,}\+)\s*$")


_SIDES = "│┃║"


_INNER_BORDER = LazyRe(r"^[╭╰]─*(?:[^─]{1,80}─*)?[╮╯]$")


# Text that starts a new logical line even when glued onto another.
_GLUED = LazyRe(
    r"(?<=\S)(?=Traceback \(most recent call last\):)"  # tqdm bar + traceback
    r"|(?<=\S)\s{2,}(?=File \"[^\"]{1,500}\", line \d)"  # padded lines joined in a paste
)


# A traceback flattened onto one line: "Traceback (...): File "a.py", line 3, in f x() ..."
_FLAT_FRAME = LazyRe(r"(?<=\S)\s+(?=File \"[^\"]{1,500}\", line \d{1,7})")


_FLAT_CODE = LazyRe(r"^(File \"[^\"]{1,500}\", line \d{1,7}, in [^\s]{1,200})\s+(.+)$")


_FLAT_EXC = LazyRe(
    r"\s(?=(?:[A-Za-z_]\w{0,60}\.){0,8}[A-Z]\w{0,60}(?:Error|Exception|Interrupt|Exit|Warning|Failure|Failed)(?::\s|$))"
)


# Escaped text inside a JSON string (torchelastic's error file, structured loggers).
_ESCAPE = LazyRe(r"\\(u[0-9a-fA-F]{4}|.)")


_ESCAPES = {"n": "\n", "t": "    ", "r": "", '"': '"', "\\": "\\", "/": "/", "'": "'", "b": "", "f": ""}


_JSON_KEY = LazyRe(r'^\s{0,40}[{\[,]{0,4}\s{0,8}"[\w .-]{1,60}":\s{0,4}[{\[]{0,2}\s{0,4}"?')


_JSON_TAIL = LazyRe(r'"[\s,}\]"]{0,16}$')


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        s = m.group(1)
        if len(s) == 5:
            try:
                return chr(int(s[1:], 16))
            except ValueError:
                return m.group(0)
        return _ESCAPES.get(s, m.group(0))

    return _ESCAPE.sub(one, text)


def _looks_escaped_traceback(text: str) -> bool:
    return "\\n" in text and (
        "Traceback (most recent call last)" in text or 'File \\"' in text or "\\n  File " in text
    )


def split_logical(body: str) -> list[str]:
    """One cleaned, prefix-free physical line -> the logical lines it holds."""
    if len(body) > 64 * _HEAD:  # a giant line: no structure to recover, keep it whole
        return [body]
    if _looks_escaped_traceback(body):
        # A traceback inside a JSON string: unescape (twice for a JSON-in-JSON blob,
        # as torchelastic writes it) and give each line of it back.
        for _ in range(3):
            body = _unescape(body)
            if "\\n" not in body:
                break
        out: list[str] = []
        for piece in body.split("\n"):
            piece = _JSON_TAIL.sub("", _JSON_KEY.sub("", piece))
            if piece.strip():
                out.extend(split_logical(piece))
        out.append("")  # the blob ends here: so does any message read from it
        return out
    if "Traceback (most recent call last)" in body and _FLAT_FRAME.search(body):
        return _unflatten(body)
    if "Traceback (most recent call last)" in body or 'File "' in body:
        return [p for p in _GLUED.split(body)]
    if body[:2] == "  " and len(body) <= 400:
        twice = _doubled(body)
        if twice:
            return [twice, twice]
    return [body]


def _doubled(body: str) -> str | None:
    """A traceback's source line written by two processes at once and glued mid-line
    ("    self.optimizer.step()self.optimizer.step()", "    main()    main()"): the one
    line (with its indentation), or None."""
    text = body.strip()
    if len(text) < 8:
        return None
    at = text.find(text[:4], 4)
    for _ in range(4):
        if at == -1:
            break
        first, second = text[:at].rstrip(), text[at:]
        if first == second:
            return body[:len(body) - len(body.lstrip())] + first
        at = text.find(text[:4], at + 1)
    return None


def _unflatten(body: str) -> list[str]:
    """'Traceback (most recent call last): File "a.py", line 3, in f x() E: m' -> lines."""
    parts = _FLAT_FRAME.split(body)
    out: list[str] = []
    for i, part in enumerate(parts):
        if not part.startswith("File "):
            out.extend(_GLUED.split(part))
            continue
        m = _FLAT_CODE.match(part)
        if not m:
            out.append("  " + part)
            continue
        out.append("  " + m.group(1))
        rest = m.group(2)
        if i == len(parts) - 1:
            e = _FLAT_EXC.search(rest)
            if e:
                code, exc = rest[: e.start()], rest[e.start() + 1:]
                if code.strip():
                    out.append("    " + code.strip())
                out.append(exc)
                continue
        out.append("    " + rest)
    return out


class _Box:
    """A rich box being read for one stream of lines; `width` is its outer width (the
    console width rich drew it at)."""

    __slots__ = ("width", "lines")

    def __init__(self, width: int):
        self.width = width
        self.lines: list[LogLine] = []


class _Stream:
    """Per-stream state. After a box closes, rich prints the exception message wrapped at
    the console width; those lines are held in `message` until it ends, to be rejoined."""

    __slots__ = ("box", "message", "message_width", "handler_line", "handler_col")

    def __init__(self) -> None:
        self.box: _Box | None = None
        self.message: list[LogLine] = []
        self.message_width = 0
        # the last line a rich logging handler printed, and its message column
        self.handler_line: LogLine | None = None
        self.handler_col = 0


_GUTTER = LazyRe(r"^\s*(?:❱\s*)?\d{1,6}(?: |$)")  # rich's code lines: "❱ 13 │ code", "   7 x = 1"


# A paste quoted or marked line by line: e-mail/markdown quotes ("> ", "> > "), a diff's
# added lines ("+"), a table or blame column ("| ", "│"), a line-number gutter ("12 | ").
# Rich/ASCII boxes ("╭─", "│ ... │", "+---+", "| ... |") are the box reader's, never unquoted.
_QUOTE_MARKS = ">+|0123456789 ["
_QUOTE = LazyRe(r"^(?:>[ \t]?){1,4}|^\+(?![+-]{2})|^\|\s?|^\s{0,6}\d{1,6}\s{0,3}\|\s?|^\[\d{1,7}\](?: |$)")
_BOXED = LazyRe(r"[╭┏╔│┃║]|^\s*\+-{10,}", re.M)
_TABLE_END = LazyRe(r"\s{0,4}[|│]\s{0,4}$")
QUOTED_SHARE = 0.6  # of a paste's first non-blank lines carrying one mark: the paste is quoted


def unquote(text: str) -> str:
    """`text` with a quote or diff mark taken off every line that carries it, when most
    of its first lines carry the same mark (one cheap look at the head otherwise)."""
    first = text.lstrip("\n")[:1]
    if not first or first not in _QUOTE_MARKS:
        return text
    if first == "[" and not _QUOTE.match(text.lstrip("\n")[:40]):
        return text  # "[rank0]:", "[2024-...": a prefix the line cleaner reads, not a gutter
    if _BOXED.search(text[:4096]):
        return text
    head = [ln for ln in text[:4096].split("\n")[:60] if ln.strip()]
    kinds: dict[str, int] = {}
    numbers: list[int] = []  # a bracketed gutter's numbers ("[1743] ")
    for ln in head:
        m = _QUOTE.match(ln)
        if m:
            kind = _quote_kind(m.group(0))
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind == "[":
                numbers.append(int(m.group(0).strip()[1:-1]))
    if not kinds:
        return text
    kind, n = max(kinds.items(), key=lambda kv: kv[1])
    if n < 3 or n < QUOTED_SHARE * len(head):
        return text
    if kind == "[" and sum(b == a + 1 for a, b in zip(numbers, numbers[1:])) < QUOTED_SHARE * (len(numbers) - 1):
        return text  # "[0] ", "[3] ": process tags, not a gutter counting the lines
    out = []
    for ln in text.split("\n"):
        m = _QUOTE.match(ln)
        if m and _quote_kind(m.group(0)) == kind:
            ln = ln[m.end():]
            if kind == "|":
                ln = _TABLE_END.sub("", ln)
        out.append(ln)
    return "\n".join(out)


# A markdown table's rule row ("|------|------|", "|---:|:---|", "| --- | --- |"): the table
# around it is read as whitespace columns, as the program printed them before they were
# put in a table ("| 300 | nan |" -> "300   nan"), so a cell is never taken for a prefix.
_MD_TABLE_RULE = LazyRe(r"^[ \t]{0,3}\|?[ \t]{0,3}:?-{3,}:?[ \t]{0,3}\|[ \t:|-]{0,400}$", re.M)


_DASH_PIPE = LazyRe(r"-[ \t:]{0,3}\|")  # in every rule row; a literal-led search, fast on any text


def _has_table_rule(text: str, tries: int = 200) -> bool:
    for m in _DASH_PIPE.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        if _MD_TABLE_RULE.match(text[start:end if end != -1 else len(text)]):
            return True
        tries -= 1
        if not tries:
            return False
    return False


def untable(text: str) -> str:
    """`text` with its markdown tables turned into whitespace-separated columns (their
    rule rows left blank, so line numbers stay); one search when there is none."""
    if not _has_table_rule(text):
        return text
    lines = text.split("\n")
    done = set()
    for i, ln in enumerate(lines):
        if i in done or not _MD_TABLE_RULE.match(ln):
            continue
        lo, hi = i, i
        while lo > 0 and lines[lo - 1].lstrip()[:1] == "|":
            lo -= 1
        while hi + 1 < len(lines) and lines[hi + 1].lstrip()[:1] == "|":
            hi += 1
        for j in range(lo, hi + 1):
            done.add(j)
            row = lines[j]
            if _MD_TABLE_RULE.match(row):
                lines[j] = ""
                continue
            cells = row.strip().strip("|").split("|")
            lines[j] = "   ".join(c.strip() for c in cells)
    return "\n".join(lines)


def _quote_kind(mark: str) -> str:
    first = mark.strip()[:1]
    return "gutter" if first.isdigit() else first


def normalise(text: str, first_line_no: int = 1) -> list[LogLine]:
    """Turn raw (decoded) log text into clean logical lines."""
    text = unquote(untable(text))
    out: list[LogLine] = []
    streams: dict[tuple[int | None, str | None], _Stream] = {}

    def flush_message(st: _Stream) -> None:
        if st.message:
            out.extend(_rejoin(st.message, st.message_width, inner=False))
            st.message = []

    def flush_box(st: _Stream) -> None:
        if st.box is not None:
            out.extend(_rejoin(st.box.lines, st.box.width - 4, inner=True))
            st.box = None

    def add(physical: str, no: int) -> None:
        cleaned = clean_physical_line(physical)
        body, rank, stream = _strip_prefixes(cleaned)
        st = streams.setdefault((rank, stream), _Stream())
        head = body[:_HEAD]
        stripped = head.strip()
        if st.handler_line is not None:
            col = st.handler_col
            if (st.box is None and not st.message and stripped and len(body) > col
                    and not body[:col].strip() and body[col] != " " and not _starts_structure(stripped)):
                # the handler wrapped its message at the terminal width: one line again
                st.handler_line.text = st.handler_line.text.rstrip() + " " + stripped
                st.handler_line.raw = st.handler_line.raw.rstrip() + " " + stripped  # evidence reads whole
                return
            st.handler_line = None
        if stripped[:1] in "╭┏╔╰┗╚│┃║+|" and stripped:
            if st.box is None and _headless_box_line(stripped):
                # a paste that starts inside a rich traceback box (its top border cut off):
                # read the box from here, at this line's width
                flush_message(st)
                st.box = _Box(width=len(stripped))
            if _box_line(st, body, no, rank, cleaned, stream, out, flush_box, flush_message):
                return
        if st.message:
            # The message rich wrapped ends at a blank line, at a new structure, or at a
            # line that could not have been wrapped at the box's width (a progress bar).
            if (not stripped or _starts_structure(stripped) or len(body) > st.message_width
                    or _PROGRESS.search(head)):
                flush_message(st)
            else:
                st.message.append(LogLine(no, body, rank, cleaned, stream))
                return
        for part in split_logical(body):
            out.append(LogLine(no, part, rank, cleaned, stream))
        if cleaned[:1] in "[0123456789" and out and out[-1].no == no:
            m = _RICH_HANDLER.match(cleaned[:_HEAD])
            if m:
                st.handler_line, st.handler_col = out[-1], m.end()

    no = first_line_no - 1
    for physical_line in text.split("\n"):
        no += 1
        for overwritten in split_overwrites(physical_line):
            if "it/s]" in overwritten or "s/it]" in overwritten:  # a tqdm bar: something may be glued after it
                for physical in split_after_progress(overwritten):
                    add(physical, no)
            else:
                add(overwritten, no)
    for st in streams.values():
        flush_box(st)
        flush_message(st)
    out.sort(key=lambda ln: ln.no)  # flushes can land late; the sort is stable
    return out


def _box_line(st: _Stream, body: str, no: int, rank: int | None, cleaned: str, stream: str | None,
              out: list[LogLine], flush_box, flush_message) -> bool:
    """Handle a line that may belong to a rich box; True when it was consumed."""
    stripped = body.strip()
    if len(stripped) > 2000:  # wider than any terminal: not a box line
        return False
    title = _box_title(stripped)
    if title is not None and (st.box is None or "Traceback" in title):
        flush_box(st)
        flush_message(st)
        st.box = _Box(width=len(stripped))
        if "Traceback" in title:
            out.append(LogLine(no, "Traceback (most recent call last):", rank, cleaned, stream))
        return True
    if st.box is None:
        return False
    if _BOX_BOTTOM.match(stripped):
        width = st.box.width
        flush_box(st)
        st.message_width = width
        st.message = []
        # The message starts on the next line; mark the state so it is collected.
        st.message.append(LogLine(no, "", rank, cleaned, stream))
        return True
    if stripped[0] in _SIDES or stripped[0] == "|":
        inner = stripped[1:]
        if inner[:1] == " ":
            inner = inner[1:]
        if inner and inner[-1] in _SIDES + "|":
            inner = inner[:-1]
        inner = inner.rstrip()
        # A nested panel (rich's locals): drop its borders, keep its rows.
        if _INNER_BORDER.match(inner.strip()):
            return True
        if inner[:1] in _SIDES:
            inner = inner[1:].strip()
            if inner[-1:] in _SIDES:
                inner = inner[:-1].rstrip()
        st.box.lines.append(LogLine(no, inner, rank, cleaned, stream))
        return True
    return False


# A rich traceback box's own row: a frame ("path.py:355 in __init__", or its path folded at
# the box edge: "/home/u/.../accelerate/accel"), or the marked source line ("❱ 355 │ raise ...").
_TRACEBACK_BOX_ROW = LazyRe(r"^[│┃] (?:.{0,400}\.py:\d{1,7} in [\w<>]{1,80}|\s{0,6}❱ {0,3}\d{1,7} "
                            r"|(?:[A-Za-z]:\\|/|~/)[\w.~\\/-]{20,}\s*[│┃]$)")


def _headless_box_line(stripped: str) -> bool:
    return (len(stripped) <= 400 and stripped[-1:] in "│┃"
            and ("❱" in stripped or ".py:" in stripped or "/" in stripped or "\\" in stripped)
            and _TRACEBACK_BOX_ROW.match(stripped) is not None)


def _box_title(stripped: str) -> str | None:
    """The title of a box's top border ("╭─── Traceback ───╮" -> "Traceback"), or None
    when `stripped` is not one. Linear: string methods, no backtracking."""
    if len(stripped) >= 2 and stripped[0] in _BOX_CORNERS[0] and stripped[-1] in _BOX_CORNERS[1]:
        return stripped[1:-1].lstrip("─").lstrip().rstrip("─").rstrip()
    if stripped[:1] == "+":
        m = _BOX_TOP_ASCII.match(stripped)
        if m:
            return m.group("title")
    return None


def _starts_structure(text: str) -> bool:
    return (text.startswith(("Traceback", "The above exception", "During handling", "File ", "[", "{"))
            or text[:1] in "╭┏╔")


def _rejoin(lines: list[LogLine], width: int, inner: bool) -> list[LogLine]:
    """Rejoin lines rich wrapped at `width`: a line that ran to the edge (a folded word)
    joins the next without a space; one whose next word would not have fitted joins it
    with a space. Rich's code lines are cropped, never wrapped, and are kept as they are."""
    lines = [ln for ln in lines if ln.text or inner]
    if not inner:
        lines = [ln for ln in lines if ln.text.strip()]
    joined: list[LogLine] = []
    last = ""  # the previous physical line (what rich wrapped), not the text joined so far
    for ln in lines:
        p = last.rstrip()
        last = ln.text
        if joined and width > 20 and ln.text.strip() and p:
            nxt = ln.text.strip()
            if not (inner and (_GUTTER.match(p) or _GUTTER.match(ln.text))):
                prev = joined[-1]
                first_word = nxt.split(" ", 1)[0]
                # Rich folds only a word longer than the width, so a folded piece
                # fills its whole line and has no space in it.
                if len(p) >= width and " " not in p.lstrip():
                    prev.text = prev.text.rstrip() + nxt
                    continue
                if len(p) + 1 + len(first_word) > width:
                    prev.text = prev.text.rstrip() + " " + nxt
                    continue
        joined.append(LogLine(ln.no, ln.text, ln.rank, ln.raw, ln.stream))
    return joined
