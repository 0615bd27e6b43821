"""The one normaliser for log text, and the traceback segmenter.

Everything that reads a log (explain, run's captured tail, the rule self-tests) goes
through `normalise()` and `segment()`. Pasted logs are damaged in many ways (see
../shared/reference/log-forms.md): ANSI colours, `\\r` progress bars, CRLF, rank and
timestamp prefixes, rich boxes that wrap long lines, Jupyter frames, tracebacks glued
onto progress bars, flattened onto one line or escaped inside a JSON string, full-width
punctuation. This module turns them into clean logical lines that keep their original
line numbers, so that rules can be written against the library's own message and
evidence still points at the line the user pasted.

Every regular expression here is applied to a bounded slice of a line (or is linear),
so a 20 MB line costs time proportional to its length, never more.
"""

from __future__ import annotations

import re
import unicodedata

class _LazyRe:
    """A module-level regular expression compiled on first use: `mpdoctor explain` on a
    short traceback needs only some of the forms below, and compiling all of them costs
    more than reading the traceback. After the first use its methods are plain
    attributes, as fast as the compiled pattern's own."""

    def __init__(self, pattern: str, flags: int = 0):
        self._args = (pattern, flags)

    def __getattr__(self, name: str):
        rx = re.compile(*self._args)
        for method in ("match", "search", "sub", "split", "finditer", "findall", "fullmatch", "pattern"):
            self.__dict__[method] = getattr(rx, method)
        return getattr(rx, name)


# The longest text a rule pattern ever sees at once (keeps matching bounded).
MAX_MATCH_CHARS = 8192
# Structure (prefixes, boxes, frames, exception lines) is read from this many
# characters of a line; the rest of a very long line is kept but not parsed.
_HEAD = 4096

# --- line cleaning -------------------------------------------------------------------

_ANSI = _LazyRe(
    r"(?:\x1b|\^\[)\[[0-9;:?<>=!]{0,64}[ -/]{0,8}[@-~]"  # CSI (colours, cursor moves); ^[ = cat -v
    r"|\x1b\][^\x07\x1b]{0,2048}(?:\x07|\x1b\\)"  # OSC (titles, hyperlinks)
    r"|\x1b[@-Z\\-_]"  # two-byte escapes
    r"|\[(?:[0-9]{1,3};){0,6}[0-9]{1,3}m"  # ESC lost in a copy-paste: "[0;31m", "[38;5;241m"
)
_CONTROL = _LazyRe(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# Full-width and CJK punctuation from localised terminals and machine-translated pages.
# NFKC maps most full-width forms to ASCII but glues them to the next word
# ("RuntimeError：CUDA" -> "RuntimeError:CUDA"); these keep the space that the English
# message has, so that rules see the library's own wording.
_WIDE_PUNCT = _LazyRe(r"([（【「『])|([：；，。、！？）】」』])[ \t\u3000]{0,8}")
_WIDE_MAP = {
    "：": ": ", "；": "; ", "，": ", ", "。": ". ", "、": ", ", "！": "! ", "？": "? ",
    "（": " (", "）": ") ", "【": " [", "】": "] ", "「": ' "', "」": '" ', "『": ' "', "』": '" ',
}
_QUOTE_PAIRS = (("“", '"'), ("”", '"'), ("‘", "'"), ("’", "'"), ("\u3000", " "), ("\u00a0", " "))
_TRAILING_PUNCT_SPACE = _LazyRe(r"(?<=[:;,.!?)\]\"]) (?=[\"')\],.]|$)")

# Prefixes stacked before the real text. Each is tried repeatedly at the line start.
_RANK_PREFIXES = (
    ("[", _LazyRe(r"\[(?:rank|default|Rank)(?P<rank>\d{1,5})\]:?\s?")),  # [rank0]: / [default3]:
    ("[", _LazyRe(r"\[\d{1,5},(?P<rank>\d{1,5})\]<std(?:out|err)>:\s?")),  # mpirun --tag-output
    ("(", _LazyRe(r"\((?:\w{1,40} )?rank=(?P<rank>\d{1,5})[^)]{0,80}\)\s?")),  # (VllmWorker rank=1 pid=12)
    ("rR", _LazyRe(r"(?:rank|Rank|RANK)\s?(?P<rank>\d{1,5})\s?[:|]\s?(?=\S)")),  # rank 1: / Rank0 |
    ("0123456789", _LazyRe(r"(?P<rank>\d{1,3}): ")),  # torchrun --tee / srun -l "0: "
)
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|SUCCESS)"
_OTHER_PREFIXES = (
    # ISO-ish or US timestamps, optionally bracketed, optionally followed by a logger
    # name and a level: "2024-01-01 12:00:00,123 - root - ERROR - ", "[2024-...][INFO] "
    ("[0123456789", _LazyRe(
        r"\[?(?:\d{4}-\d{2}-\d{2}|\d{2}/\d{2}/\d{2,4})[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?"
        r"(?:Z|[+-]\d{2}:?\d{2}| ?[A-Z]{3})?\]?"
        r"(?:\s{0,4}[-|:]?\s{0,4}(?:[\w.]{1,60}\s{1,4}[-|:]\s{1,4})?\[?" + _LEVEL + r"\]?)?"
        r"(?:\s{0,8}[-|:]\s?(?:[\w.]{1,60}\s[-|:]\s|[\w.<>]{1,120}:[\w.<>]{1,120}:\d{1,7}\s-\s)?|\s{1,8}|$)"
    )),
    # journald / syslog: "Oct 04 15:02:41 host unit[123]: "
    ("ABCDEFGHIJKLMNOPQRSTUVWXYZ", _LazyRe(r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S{1,64} [\w.@/-]{1,64}(?:\[\d{1,10}\])?: ?")),
    # glog (torch's C++ and torchrun): "W1004 15:02:41.123456 12345 file.cpp:12] "
    ("IWEF", _LazyRe(r"[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{1,9}\s{1,8}\d{1,10} [\w./-]{1,200}:\d{1,7}\](?: |$)")),
    # vLLM: "ERROR 10-14 12:32:47 multiproc_worker_utils.py:233] ", "INFO 03-02 19:49:43 [x.py:242] "
    ("DIWECFTS", _LazyRe(r"" + _LEVEL + r" \d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})? \[?[\w./-]{1,200}:\d{1,7}\](?: |$)")),
    # bare clock time "[12:00:01] " or "12:00:01 " (rich's log time column too)
    ("[0123456789", _LazyRe(r"\[?\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9}|-\d{6})?\]?(?:\s|$)")),
    # python logging "ERROR:root:" / "WARNING:torch.distributed.run:"
    ("DIWECFTS", _LazyRe(r"" + _LEVEL + r":[\w.<>-]{1,120}:")),
    # loguru "2024-.. | ERROR    | mod:fn:12 - " once the time is gone: "| ERROR    | mod:fn:12 - "
    ("| DIWECFTS", _LazyRe(r"\|?\s?" + _LEVEL + r"\s{1,8}\|\s?(?:[\w.<>]{1,120}:[\w.<>]{1,120}:\d{1,7}\s-\s)?")),
    # bracketed level "[ERROR] " / "[INFO|trainer.py:123] " / deepspeed "[real_accelerator.py:219:get_accelerator] "
    ("[", _LazyRe(r"\[" + _LEVEL + r"(?:\|[^\]]{0,200})?\]\s?")),
    ("[", _LazyRe(r"\[[\w.-]{1,120}\.py:\d{1,7}(?::[\w<>.]{1,120})?\]\s?")),
    # rich logging's level column: "ERROR    message" (level padded to 8)
    ("DIWECFTS", _LazyRe(r"" + _LEVEL + r"\s{2,8}(?=\S)")),
    # Ray / vLLM process tags "(pid=123) ", "(WorkerDict pid=1, ip=10.0.0.1) "
    ("(", _LazyRe(r"\((?:\w{1,40} )?pid=\d{1,10}[^)]{0,80}\)\s?")),
    # docker compose "trainer_1  | ", "trainer-1 | "
    (None, _LazyRe(r"[\w.-]{1,64}(?:[-_]\d{1,4})?\s{1,32}\| ")),
    # workflow runners "[run/step/task (pid 12)] [0f1e...] "
    ("[", _LazyRe(r"\[[\w./-]{1,200} \(pid \d{1,10}\)\]\s?(?:\[[0-9a-f-]{8,64}\]\s?)?")),
    # accelerate's test harness / CI runners: "stderr: ", "stdout: "
    ("s", _LazyRe(r"std(?:err|out): ?")),
    # pdsh / clush / deepspeed multi-node host prefixes "gpu017: ", "worker-1: "
    ("abcdefghijklmnopqrstuvwxyz", _LazyRe(r"[a-z][\w-]{0,40}\d{1,5}: ")),
)
# A rich logging handler's time and level columns ("17:05:31-835745 ERROR    "): it wraps
# a long message onto lines indented to the message column, which are joined back.
_RICH_HANDLER = _LazyRe(r"\[?\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9}|-\d{6})?\]? " + _LEVEL + r" {1,8}(?=\S)")
# Prefixes that carry a process identity: interleaved lines are split by it.
_STREAM = _LazyRe(r"pid[= ](\d{1,10})|^([a-z][\w-]{0,40}\d{1,5}): |^([\w.-]{1,64})\s{1,32}\| ")

# Rich box borders (rich.traceback, rich logging with tracebacks, typer, accelerate).
_BOX_TOP = _LazyRe(r"^\s*[╭┏╔]─*\s*(?P<title>.*?)\s*─*[╮┓╗]\s*$")
_BOX_TOP_ASCII = _LazyRe(r"^\s*\+-+ ?(?P<title>Traceback \(most recent call last\)) ?-+\+\s*$")
_BOX_BOTTOM = _LazyRe(r"^\s*(?:[╰┗╚][─━═]*[╯┛╝]|\+-{10,}\+)\s*$")
_SIDES = "│┃║"
_INNER_BORDER = _LazyRe(r"^[╭╰]─*(?:[^─]{1,80}─*)?[╮╯]$")

# Text that starts a new logical line even when glued onto another.
_GLUED = _LazyRe(
    r"(?<=\S)(?=Traceback \(most recent call last\):)"  # tqdm bar + traceback
    r"|(?<=\S)\s{2,}(?=File \"[^\"]{1,500}\", line \d)"  # padded lines joined in a paste
)
# A traceback flattened onto one line: "Traceback (...): File "a.py", line 3, in f x() ..."
_FLAT_FRAME = _LazyRe(r"(?<=\S)\s+(?=File \"[^\"]{1,500}\", line \d{1,7})")
_FLAT_CODE = _LazyRe(r"^(File \"[^\"]{1,500}\", line \d{1,7}, in [^\s]{1,200})\s+(.+)$")
_FLAT_EXC = _LazyRe(
    r"\s(?=(?:[A-Za-z_]\w{0,60}\.){0,8}[A-Z]\w{0,60}(?:Error|Exception|Interrupt|Exit|Warning|Failure|Failed)(?::\s|$))"
)

# Escaped text inside a JSON string (torchelastic's error file, structured loggers).
_ESCAPE = _LazyRe(r"\\(u[0-9a-fA-F]{4}|.)")
_ESCAPES = {"n": "\n", "t": "    ", "r": "", '"': '"', "\\": "\\", "/": "/", "'": "'", "b": "", "f": ""}
_JSON_KEY = _LazyRe(r'^\s{0,40}[{\[,]{0,4}\s{0,8}"[\w .-]{1,60}":\s{0,4}[{\[]{0,2}\s{0,4}"?')
_JSON_TAIL = _LazyRe(r'"[\s,}\]"]{0,16}$')


class _Plain:
    """Plain data classes of the hot path. Not dataclasses: creating a dataclass costs
    about a millisecond at import, and `mpdoctor explain` must start like a small script."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


class LogLine(_Plain):
    """A clean logical line. `no` is the 1-based line number in the input; `raw` the line
    as pasted (ANSI removed, prefixes kept) for evidence; `stream` what separates
    interleaved writers that have no rank (a pid, a host, a service)."""

    __slots__ = ("no", "text", "rank", "raw", "stream")

    def __init__(self, no: int, text: str, rank: int | None = None, raw: str = "", stream: str | None = None):
        self.no = no
        self.text = text
        self.rank = rank
        self.raw = raw
        self.stream = stream


_PROGRESS = _LazyRe(r"\d%\||it/s\]|s/it\]|[█▉▊▋▌▍▎▏]|\d{1,12}/\d{1,12} \[\d")


def split_overwrites(line: str) -> list[str]:
    """A `\\r` rewrites the line (tqdm): the progress bars it overwrote are dropped,
    but text printed between two bars (an error, a warning) is kept."""
    if "\r" not in line:
        return [line]
    parts = [p for p in line.split("\r") if p.strip()]
    if not parts:
        return [""]
    kept = [p for p in parts[:-1] if not _PROGRESS.search(p[:_HEAD])]
    return kept + [parts[-1]]


def _wide_punct(m: re.Match[str]) -> str:
    if m.group(1):  # an opening bracket: one space before it, whatever was there
        i = m.start()
        return _WIDE_MAP[m.group(1)].lstrip() if i == 0 or m.string[i - 1] in " \t\u3000" else _WIDE_MAP[m.group(1)]
    return _WIDE_MAP[m.group(2)]


def clean_physical_line(line: str) -> str:
    """ANSI codes and control characters out; punctuation made ASCII; right padding off."""
    if "\x1b" in line or "[" in line:
        line = _ANSI.sub("", line)
    line = _CONTROL.sub("", line)
    if not line.isascii():
        line = _WIDE_PUNCT.sub(_wide_punct, line)
        for fancy, plain in _QUOTE_PAIRS:  # str.replace: translate() is slow on long lines
            if fancy in line:
                line = line.replace(fancy, plain)
        line = unicodedata.normalize("NFKC", line).replace("\ufffd", "?")
        line = _TRAILING_PUNCT_SPACE.sub("", line)
    return line.rstrip()


def strip_prefixes(line: str) -> tuple[str, int | None]:
    """Remove stacked rank / timestamp / host prefixes; return (text, rank)."""
    text, rank, _stream = _strip_prefixes(line)
    return text, rank


def _strip_prefixes(line: str) -> tuple[str, int | None, str | None]:
    rank: int | None = None
    stream: str | None = None
    for _ in range(8):
        head = line[:_HEAD]
        first = head[:1]
        for starts, rx in _RANK_PREFIXES:
            if first not in starts:
                continue
            m = rx.match(head)
            if m:
                if rank is None:
                    rank = int(m.group("rank"))
                line = line[m.end():]
                break
        else:
            first = head[:1]
            for starts, rx in _OTHER_PREFIXES:
                if starts is not None and first not in starts:
                    continue
                m = rx.match(head)
                if m and m.end() > 0:
                    if stream is None:
                        s = _STREAM.search(head[:m.end()])
                        if s:
                            stream = next(g for g in s.groups() if g)
                    line = line[m.end():]
                    break
            else:
                return line, rank, stream
    return line, rank, stream


# --- logical lines ---------------------------------------------------------------------


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
    return [body]


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


_GUTTER = _LazyRe(r"^\s*(?:❱\s*)?\d{1,6}(?: |$)")  # rich's code lines: "❱ 13 │ code", "   7 x = 1"


def normalise(text: str, first_line_no: int = 1) -> list[LogLine]:
    """Turn raw (decoded) log text into clean logical lines."""
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
        for physical in split_overwrites(physical_line):
            add(physical, no)
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
    top = _BOX_TOP.match(stripped) or _BOX_TOP_ASCII.match(stripped)
    if top and (st.box is None or "Traceback" in top.group("title")):
        flush_box(st)
        flush_message(st)
        st.box = _Box(width=len(stripped))
        if "Traceback" in top.group("title"):
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


# --- tracebacks ----------------------------------------------------------------------

TRACEBACK_HEADER = _LazyRe(r"Traceback \(most recent call last\)|回溯 ?\(最近一次调用")
CHAIN_CAUSE = "The above exception was the direct cause of the following exception"
CHAIN_DURING = "During handling of the above exception, another exception occurred"

_FRAME_FORMS = (
    _LazyRe(r'^\s*(?:File|文件) ?"(?P<file>[^"]{1,1000})", ?(?:line |第 ?)(?P<line>\d{1,7})(?: ?行)?(?:, ?(?:in|在) (?P<func>\S{1,300}))?'),
    _LazyRe(r"^\s*File (?P<file>[^\s,]{1,1000}):(?P<line>\d{1,7})(?:, in (?P<func>.{1,300}))?$"),  # IPython 8
    _LazyRe(r"^\s*Cell (?P<file>In ?\[\d{0,6}\]), line (?P<line>\d{1,7})"),  # Jupyter cell
    _LazyRe(r"^\s*(?P<file><ipython-input-[^>]{1,200}>) in (?P<func>[^\s(]{1,300})"),  # old IPython
    # rich: "/path/to/file.py:12 in func"; old IPython/Colab: "/path/module.py in func(args)"
    _LazyRe(r"^\s*(?P<file>(?:/|[A-Za-z]:\\|~/|\./|\.\./)[^\s:]{0,1000}\.py):(?P<line>\d{1,7}) in (?P<func>\S{1,300})"),
    _LazyRe(r"^\s*(?P<file>[\w.\-/\\]{1,1000}\.py):(?P<line>\d{1,7}) in (?P<func>\S{1,300})$"),
    _LazyRe(r"^\s*(?P<file>(?:/|[A-Za-z]:\\|~/)[^\s]{0,1000}\.py) in (?P<func>[\w<>.]{1,300})\(.{0,2000}$"),
)
_ARROW = _LazyRe(r"^\s*-{1,4}> ?(?P<line>\d{1,7})\b")  # IPython's "----> 12 train()"
_EXCEPTION_LINE = _LazyRe(
    # a bare `Exception` (raise Exception("...")) too, but not a bare "Error:"/"Warning:"
    r"^(?P<type>(?:[A-Za-z_]\w{0,80}\.){0,12}(?:[A-Za-z_]\w{0,80}(?:Error|Exception|Interrupt|Exit|Warning|"
    r"Failure|Fault|Timeout|Abort)|Exception))(?::\s?(?P<message>.*))?$"
)
# After frames, any "dotted.CamelName: message" at the traceback's own indentation is the
# exception line too (torch._dynamo.exc.BackendCompilerFailed, hydra's ConfigCompositionException).
_EXCEPTION_AFTER_FRAMES = _LazyRe(
    r"^(?P<type>(?:[A-Za-z_]\w{0,80}\.){0,12}[A-Z]\w{0,80})(?::\s?(?P<message>.*))?$"
)
_STDLIB_OR_SITE = _LazyRe(
    r"(site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]lib[/\\][\w.-]+\.py$|<frozen |"
    r"^<(?!ipython-input)[^>]*>$|[/\\](?:torch|accelerate|transformers|deepspeed|lightning|pytorch_lightning|"
    r"peft|trl|bitsandbytes|flash_attn|apex|vllm|diffusers|xformers|triton)[/\\]|"
    # mpdoctor's own instrumentation and probe, from a checkout as much as from a wheel
    r"[/\\]mpdoctor[/\\](?:instrument|probe|run|env|engine|commands)[/\\]|"
    r"[/\\]\.pyenv[/\\]|[/\\]conda[/\\].*[/\\]lib[/\\]|[/\\]bin[/\\][\w.-]+$|"
    # a Windows venv's launcher (Scripts\accelerate.exe), not a project's own scripts/ folder
    r"[/\\]Scripts[/\\][^/\\]+\.exe\b|[/\\]\.?venv[/\\]Scripts[/\\]|"
    # Cython sources (pandas/_libs/parsers.pyx, .pxi) are a library's compiled code
    r"\.pyx$|\.pxi$)",
    re.IGNORECASE,
)


class Frame(_Plain):
    """One frame of a traceback; `no` is the log line it was read from."""

    __slots__ = ("file", "line", "func", "no")

    def __init__(self, file: str, line: int | None, func: str | None, no: int):
        self.file = file
        self.line = line
        self.func = func
        self.no = no

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    @property
    def is_user_code(self) -> bool:
        return not _STDLIB_OR_SITE.search(self.file)


class Traceback(_Plain):
    """A traceback: `start` is the log line of its header, `end` the last line of its
    exception message. `chained_from` is set when it follows "The above exception was
    the direct cause..." or "During handling of the above exception...": the index (in
    segment()'s list) of the earlier one; `chain_kind` is "cause" or "during"."""

    __slots__ = ("rank", "start", "end", "frames", "exc_type", "exc_message", "exc_line",
                 "chained_from", "chain_kind", "stream")

    def __init__(self, rank: int | None, start: int, end: int, stream: str | None = None):
        self.rank = rank
        self.start = start
        self.end = end
        self.frames: list[Frame] = []
        self.exc_type: str | None = None
        self.exc_message = ""
        self.exc_line: int | None = None
        self.chained_from: "int | Traceback | None" = None
        self.chain_kind: str | None = None
        self.stream = stream

    @property
    def user_frame(self) -> Frame | None:
        for fr in reversed(self.frames):
            if fr.is_user_code:
                return fr
        return None


def parse_frame(text: str, no: int) -> Frame | None:
    head = text[:_HEAD]
    if "File" not in head and ".py" not in head and "In" not in head and "ipython" not in head and "文件" not in head:
        return None
    for rx in _FRAME_FORMS:
        m = rx.match(head)
        if m:
            d = m.groupdict()
            line = d.get("line")
            return Frame(d["file"], int(line) if line else None, d.get("func"), no)
    return None


def exception_line(text: str) -> tuple[str, str] | None:
    m = _EXCEPTION_LINE.match(text[:MAX_MATCH_CHARS].strip())
    if not m:
        return None
    return m.group("type"), (m.group("message") or "").strip()


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip(" "))


def segment(lines: list[LogLine]) -> list[Traceback]:
    """Find the tracebacks, per rank stream, with their frames, exception and chain."""
    streams: dict[tuple[int | None, str | None], list[LogLine]] = {}
    for ln in lines:
        streams.setdefault((ln.rank, ln.stream), []).append(ln)
    found: list[Traceback] = []
    for (rank, stream), lns in streams.items():
        found.extend(_segment_stream(lns, rank, stream))
    found.sort(key=lambda t: (t.start, -1 if t.rank is None else t.rank, t.stream or ""))
    # Chains were recorded per stream as objects; turn them into indices of `found`.
    index = {id(t): i for i, t in enumerate(found)}
    for t in found:
        if isinstance(t.chained_from, Traceback):
            t.chained_from = index.get(id(t.chained_from))
    return found


def _segment_stream(stream: list[LogLine], rank: int | None, stream_id: str | None) -> list[Traceback]:
    result: list[Traceback] = []
    current: Traceback | None = None
    pending_chain: str | None = None
    in_message = False
    frame_indent = 0
    for ln in stream:
        text = ln.text
        head = text[:_HEAD]
        if "Traceback" in head or "回溯" in head:
            if TRACEBACK_HEADER.search(head):
                if current is not None:
                    result.append(current)
                previous = result[-1] if result else None
                current = Traceback(rank=rank, start=ln.no, end=ln.no, stream=stream_id)
                if pending_chain and previous is not None:
                    current.chained_from = previous  # type: ignore[assignment]  # resolved in segment()
                    current.chain_kind = pending_chain
                pending_chain = None
                in_message = False
                frame_indent = 0
                continue
        if CHAIN_CAUSE in head or CHAIN_DURING in head:
            if current is not None:
                result.append(current)
                current = None
            pending_chain = "cause" if CHAIN_CAUSE in head else "during"
            continue
        if current is None:
            continue
        if not in_message:
            frame = parse_frame(text, ln.no)
            if frame is not None:
                if not current.frames:
                    frame_indent = _indent(text)
                else:
                    frame_indent = min(frame_indent, _indent(text))
                current.frames.append(frame)
                current.end = ln.no
                continue
            arrow = _ARROW.match(head)
            if arrow and current.frames and current.frames[-1].line is None:
                current.frames[-1].line = int(arrow.group("line"))
                current.end = ln.no
                continue
        if current.exc_type is None:
            exc = _exception(text, current, frame_indent)
            if exc is not None:
                current.exc_type, current.exc_message = exc
                current.exc_line = ln.no
                current.end = ln.no
                in_message = True
                continue
            current.end = ln.no
            continue
        # Lines after the exception line continue its message until a blank line.
        if text.strip() and in_message and not text.startswith("[") and len(current.exc_message) < 4000:
            current.exc_message += "\n" + text[:MAX_MATCH_CHARS].strip()
            current.end = ln.no
        else:
            result.append(current)
            current = None
            in_message = False
    if current is not None:
        result.append(current)
    return result


def _exception(text: str, tb: Traceback, frame_indent: int) -> tuple[str, str] | None:
    stripped = text[:MAX_MATCH_CHARS].strip()
    if not stripped:
        return None
    if tb.frames:
        # The exception line is never indented deeper than the frames (code lines are).
        if _indent(text) > frame_indent:
            return None
        m = _EXCEPTION_LINE.match(stripped) or _EXCEPTION_AFTER_FRAMES.match(stripped)
    else:
        # A traceback whose frames were cut from the paste: only a clear exception line.
        if text.startswith(" "):
            return None
        m = _EXCEPTION_LINE.match(stripped)
    if not m:
        return None
    return m.group("type"), (m.group("message") or "").strip()
