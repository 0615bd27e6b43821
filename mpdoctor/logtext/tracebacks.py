"""Tracebacks in normalised lines: frames, the exception line, chained exceptions
(cause first), and the user's own frame. `segment()` is the entry."""

from __future__ import annotations

import re

from .lines import _HEAD, MAX_MATCH_CHARS, LazyRe, LogLine, _Plain

TRACEBACK_HEADER = LazyRe(r"Traceback \(most recent call last\)|回溯 ?\(最近一次调用")


CHAIN_CAUSE = "The above exception was the direct cause of the following exception"


CHAIN_DURING = "During handling of the above exception, another exception occurred"


_FRAME_FORMS = (
    LazyRe(r'^\s*(?:File|文件) ?"(?P<file>[^"]{1,1000})", ?(?:line |第 ?)(?P<line>\d{1,7})(?: ?行)?(?:, ?(?:in|在) (?P<func>\S{1,300}))?'),
    LazyRe(r"^\s*File (?P<file>[^\s,]{1,1000}):(?P<line>\d{1,7})(?:, in (?P<func>.{1,300}))?$"),  # IPython 8
    LazyRe(r"^\s*Cell (?P<file>In ?\[\d{0,6}\]), line (?P<line>\d{1,7})"),  # Jupyter cell
    LazyRe(r"^\s*(?P<file><ipython-input-[^>]{1,200}>) in (?P<func>[^\s(]{1,300})"),  # old IPython
    # rich: "/path/to/file.py:12 in func"; old IPython/Colab: "/path/module.py in func(args)"
    LazyRe(r"^\s*(?P<file>(?:/|[A-Za-z]:\\|~/|\./|\.\./)[^\s:]{0,1000}\.py):(?P<line>\d{1,7}) in (?P<func>\S{1,300})"),
    LazyRe(r"^\s*(?P<file>[\w.\-/\\]{1,1000}\.py):(?P<line>\d{1,7}) in (?P<func>\S{1,300})$"),
    LazyRe(r"^\s*(?P<file>(?:/|[A-Za-z]:\\|~/)[^\s]{0,1000}\.py) in (?P<func>[\w<>.]{1,300})\(.{0,2000}$"),
)


# What each frame form cannot match without.
_FRAME_NEEDS = (("File", "文件"), ("File ",), ("Cell ",), ("<ipython-input",), (".py:",), (".py:",), (".py in ",))


_ARROW = LazyRe(r"^\s*-{1,4}> ?(?P<line>\d{1,7})\b")  # IPython's "----> 12 train()"


_EXCEPTION_LINE = LazyRe(
    # a bare `Exception` (raise Exception("...")) too, but not a bare "Error:"/"Warning:"
    r"^(?P<type>(?:[A-Za-z_]\w{0,80}\.){0,12}(?:[A-Za-z_]\w{0,80}(?:Error|Exception|Interrupt|Exit|Warning|"
    r"Failure|Fault|Timeout|Abort)|Exception))(?::\s?(?P<message>.*))?$"
)


# After frames, any "dotted.CamelName: message" at the traceback's own indentation is the
# exception line too (torch._dynamo.exc.BackendCompilerFailed, hydra's ConfigCompositionException).
_EXCEPTION_AFTER_FRAMES = LazyRe(
    r"^(?P<type>(?:[A-Za-z_]\w{0,80}\.){0,12}[A-Z]\w{0,80})(?::\s?(?P<message>.*))?$"
)


_STDLIB_OR_SITE = LazyRe(
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
    for needs, rx in zip(_FRAME_NEEDS, _FRAME_FORMS):
        if not any(n in head for n in needs):
            continue  # (a form is compiled only for a line that can be one)
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
