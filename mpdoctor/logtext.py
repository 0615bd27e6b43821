"""The one normaliser for log text, and the traceback segmenter.

Everything that reads a log (explain, run's captured tail, the rule self-tests) goes
through `normalise()` and `segment()`. Pasted logs are damaged in many ways (see
../shared/reference/log-forms.md): ANSI colours, `\\r` progress bars, CRLF, rank and
timestamp prefixes, rich boxes, Jupyter frames, full-width punctuation. This module
turns them into clean logical lines that keep their original line numbers, so that
rules can be written against the library's own message and evidence still points at
the line the user pasted.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

# --- line cleaning -------------------------------------------------------------------

_ANSI = re.compile(
    r"\x1b\[[0-9;:?<>=!]*[ -/]*[@-~]"  # CSI (colours, cursor moves)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC (titles, hyperlinks)
    r"|\x1b[@-Z\\-_]"  # two-byte escapes
    r"|\[(?:\d{1,3}(?:;\d{1,3})*)?m(?=\S|$)"  # ESC lost in a copy-paste: "[0;31m"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# Prefixes stacked before the real text. Each is tried repeatedly at the line start.
_RANK_PREFIXES = (
    re.compile(r"\[(?:rank|default|Rank)(?P<rank>\d+)\]:?\s?"),  # [rank0]: / [default3]:
    re.compile(r"\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:\s?"),  # mpirun --tag-output
    re.compile(r"\((?:\w+ )?rank=(?P<rank>\d+)[^)]*\)\s?"),  # (VllmWorker rank=1 pid=12)
    re.compile(r"(?:rank|Rank|RANK)\s?(?P<rank>\d+)\s?[:|]\s?"),  # rank 1: / Rank0 |
    re.compile(r"(?P<rank>\d{1,3}): "),  # torchrun --tee / slurm -l "0: "
)
_OTHER_PREFIXES = (
    # ISO-ish timestamps, optionally bracketed, optionally followed by a level
    re.compile(
        r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?"
        r"(?:\s*[-|]?\s*\[?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?)?\s*[-|:]?\s?"
    ),
    # journald / syslog: "Oct 04 15:02:41 host unit[123]: "
    re.compile(r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [\w.@-]+(?:\[\d+\])?: "),
    # glog: "W1004 15:02:41.123456 12345 file.cpp:12] "
    re.compile(r"[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+ [\w./-]+:\d+\] "),
    # bare clock time "[12:00:01] " or "12:00:01 "
    re.compile(r"\[?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\]?\s"),
    # python logging "ERROR:root:" / "WARNING:__main__:"
    re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:"),
    # bracketed level "[ERROR] " / "[INFO|trainer.py:123] "
    re.compile(r"\[(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?:\|[^\]]*)?\]\s?"),
    # Ray / vLLM process tags "(pid=123) ", "(WorkerDict pid=1, ip=10.0.0.1) "
    re.compile(r"\((?:\w+ )?pid=\d+[^)]*\)\s?"),
    # docker compose "trainer_1  | "
    re.compile(r"[\w.-]+(?:[-_]\d+)?\s+\| "),
    # workflow runners "[run/step/task (pid 12)] [0f1e...] "
    re.compile(r"\[[\w./-]+ \(pid \d+\)\]\s*(?:\[[0-9a-f-]{8,}\]\s*)?"),
    # pdsh / clush host prefixes "gpu017: "
    re.compile(r"[a-z][\w-]*\d+: "),
)

# Rich box borders.
_BOX_SIDES = "│┃║|"
_BOX_TOP = re.compile(r"^\s*[╭┏╔]─*\s*(?P<title>.*?)\s*─*[╮┓╗]\s*$")
_BOX_BOTTOM = re.compile(r"^\s*[╰┗╚][─━═]*[╯┛╝]\s*$")
_BOX_LINE = re.compile(r"^\s*[│┃║]\s?(?P<body>.*?)\s*[│┃║]\s*$")

# Text that starts a new logical line even when glued onto another (tqdm + traceback).
_GLUED_STARTS = re.compile(r"(?<=\S)(?=Traceback \(most recent call last\):)")

# The longest text a rule pattern ever sees at once (keeps matching bounded).
MAX_MATCH_CHARS = 8192


@dataclass(slots=True)
class LogLine:
    """A clean logical line. `no` is the 1-based line number in the input."""

    no: int
    text: str
    rank: int | None = None
    raw: str = ""  # the line as pasted, ANSI removed, prefixes kept (for evidence)


_PROGRESS = re.compile(r"\d%\||it/s\]|s/it\]|[█▉▊▋▌▍▎▏]")


def split_overwrites(line: str) -> list[str]:
    """A `\r` rewrites the line (tqdm): the progress bars it overwrote are dropped,
    but text printed between two bars (an error, a warning) is kept."""
    if "\r" not in line:
        return [line]
    parts = [p for p in line.split("\r") if p.strip()]
    if not parts:
        return [""]
    kept = [p for p in parts[:-1] if not _PROGRESS.search(p)]
    return kept + [parts[-1]]


def clean_physical_line(line: str) -> str:
    """ANSI codes and control characters out; right padding off."""
    if "\x1b" in line or "[" in line:
        line = _ANSI.sub("", line)
    line = _CONTROL.sub("", line)
    if not line.isascii():
        line = unicodedata.normalize("NFKC", line).replace("\ufffd", "?")
    return line.rstrip()


def strip_prefixes(line: str) -> tuple[str, int | None]:
    """Remove stacked rank / timestamp / host prefixes; return (text, rank)."""
    rank: int | None = None
    for _ in range(6):
        for rx in _RANK_PREFIXES:
            m = rx.match(line)
            if m:
                if rank is None:
                    rank = int(m.group("rank"))
                line = line[m.end():]
                break
        else:
            for rx in _OTHER_PREFIXES:
                m = rx.match(line)
                if m and m.end() < len(line):
                    line = line[m.end():]
                    break
            else:
                return line, rank
    return line, rank


def normalise(text: str, first_line_no: int = 1) -> list[LogLine]:
    """Turn raw (decoded) log text into clean logical lines."""
    out: list[LogLine] = []
    box: list[LogLine] = []
    box_width = 0

    def flush_box() -> None:
        # Rich wraps long lines inside a box: rejoin lines that ran to the border.
        nonlocal box
        if not box:
            return
        joined: list[LogLine] = []
        for ln in box:
            if joined and _was_wrapped(joined[-1].text, box_width) and ln.text.strip():
                prev = joined[-1]
                prev.text = prev.text.rstrip() + " " + ln.text.strip()
            else:
                joined.append(ln)
        out.extend(joined)
        box = []

    def _add_line(physical: str, no: int) -> None:
        nonlocal box_width
        cleaned = clean_physical_line(physical)
        body, rank = strip_prefixes(cleaned)
        bm = _BOX_LINE.match(body)
        if bm:
            box_width = max(box_width, len(body.strip()) - 2)
            box.append(LogLine(no, bm.group("body").rstrip(), rank, cleaned))
            return
        top = _BOX_TOP.match(body)
        if top:
            flush_box()
            box_width = len(body.strip()) - 2
            title = top.group("title")
            if "Traceback" in title:
                out.append(LogLine(no, "Traceback (most recent call last):", rank, cleaned))
            return
        if _BOX_BOTTOM.match(body):
            flush_box()
            return
        flush_box()
        parts = _GLUED_STARTS.split(body) if "Traceback" in body else [body]
        for part in parts:
            out.append(LogLine(no, part, rank, cleaned))

    no = first_line_no - 1
    for physical_line in text.split("\n"):
        no += 1
        for physical in split_overwrites(physical_line):
            _add_line(physical, no)
    flush_box()
    return out


def _was_wrapped(text: str, width: int) -> bool:
    return width > 20 and len(text.rstrip()) >= width - 16


# --- tracebacks ----------------------------------------------------------------------

TRACEBACK_HEADER = re.compile(r"Traceback \(most recent call last\)")
CHAIN_CAUSE = "The above exception was the direct cause of the following exception"
CHAIN_DURING = "During handling of the above exception, another exception occurred"

_FRAME_FORMS = (
    re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?'),
    re.compile(r"^\s*File (?P<file>[^\s,]+):(?P<line>\d+)(?:, in (?P<func>.+))?$"),  # IPython 8
    re.compile(r"^\s*Cell (?P<file>In\s?\[\d*\]), line (?P<line>\d+)"),  # Jupyter cell
    re.compile(r"^\s*(?P<file><ipython-input-[^>]+>) in (?P<func>[^\s(]+)"),  # old IPython
    re.compile(r"^\s*(?P<file>(?:/|[A-Za-z]:\\|~/|\./)\S+\.py):(?P<line>\d+) in (?P<func>\S+)"),
)
_EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning|"
    r"Failure|Fault|Timeout|Abort))(?::\s?(?P<message>.*))?$"
)
_STDLIB_OR_SITE = re.compile(
    r"(site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]Lib[/\\]|<frozen |"
    r"^<string>|[/\\]torch[/\\]|[/\\]accelerate[/\\]|[/\\]transformers[/\\]|"
    r"[/\\]\.pyenv[/\\]|[/\\]conda[/\\].*[/\\]lib[/\\])"
)


@dataclass(slots=True)
class Frame:
    file: str
    line: int | None
    func: str | None
    no: int  # the log line it was read from

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    @property
    def is_user_code(self) -> bool:
        return not _STDLIB_OR_SITE.search(self.file.replace("\\", "/") if "/" in self.file else self.file)


@dataclass
class Traceback:
    rank: int | None
    start: int  # log line number of the header
    end: int  # log line number of the last line of the exception message
    frames: list[Frame] = field(default_factory=list)
    exc_type: str | None = None
    exc_message: str = ""
    exc_line: int | None = None
    # Set when this traceback follows "The above exception was the direct cause..." or
    # "During handling of the above exception...": the index of the earlier one.
    chained_from: int | None = None
    chain_kind: str | None = None  # "cause" | "during"

    @property
    def user_frame(self) -> Frame | None:
        for fr in reversed(self.frames):
            if fr.is_user_code:
                return fr
        return None


def parse_frame(text: str, no: int) -> Frame | None:
    for rx in _FRAME_FORMS:
        m = rx.match(text)
        if m:
            d = m.groupdict()
            line = d.get("line")
            return Frame(d["file"], int(line) if line else None, d.get("func"), no)
    return None


def exception_line(text: str) -> tuple[str, str] | None:
    m = _EXCEPTION_LINE.match(text.strip())
    if not m:
        return None
    return m.group("type"), (m.group("message") or "").strip()


def segment(lines: list[LogLine]) -> list[Traceback]:
    """Find the tracebacks, per rank stream, with their frames, exception and chain."""
    streams: dict[int | None, list[LogLine]] = {}
    for ln in lines:
        streams.setdefault(ln.rank, []).append(ln)
    found: list[Traceback] = []
    for rank, stream in streams.items():
        found.extend(_segment_stream(stream, rank))
    found.sort(key=lambda t: (t.start, -1 if t.rank is None else t.rank))
    # Re-link chains after sorting (indices were per stream).
    return found


def _segment_stream(stream: list[LogLine], rank: int | None) -> list[Traceback]:
    result: list[Traceback] = []
    current: Traceback | None = None
    pending_chain: str | None = None
    in_message = False
    for ln in stream:
        text = ln.text
        if TRACEBACK_HEADER.search(text):
            if current is not None:
                result.append(current)
            current = Traceback(rank=rank, start=ln.no, end=ln.no)
            if pending_chain and result:
                current.chained_from = len(result) - 1
                current.chain_kind = pending_chain
            pending_chain = None
            in_message = False
            continue
        if CHAIN_CAUSE in text or CHAIN_DURING in text:
            if current is not None:
                result.append(current)
                current = None
            pending_chain = "cause" if CHAIN_CAUSE in text else "during"
            continue
        if current is None:
            continue
        frame = parse_frame(text, ln.no)
        if frame is not None and not in_message:
            current.frames.append(frame)
            current.end = ln.no
            continue
        if current.exc_type is None:
            exc = exception_line(text)
            if exc is not None and (current.frames or not text.startswith(" ")):
                current.exc_type, current.exc_message = exc
                current.exc_line = ln.no
                current.end = ln.no
                in_message = True
                continue
            current.end = ln.no
            continue
        # Lines after the exception line continue its message until a blank line.
        if text.strip() and in_message and not text.startswith("[") and len(current.exc_message) < 4000:
            current.exc_message += "\n" + text.strip()
            current.end = ln.no
        else:
            result.append(current)
            current = None
            in_message = False
    if current is not None:
        result.append(current)
    return result
