"""The terminal and oneline renderers, the console (rich, made on first use) and `emit`,
the one way out for every face's findings."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import Any

from ..findings import Report
from ..redact import _Lazy  # a pattern compiled on first use
from .common import (
    STYLE,
    SYMBOL,
    _facts_line,
    _nothing_found,
    _unrecognised_tail,
    clean_report,
    evidence_lines,
    to_json,
)
from .markdown import _num, to_markdown
from .text import _series, sparkline, wrap

# --- terminal -------------------------------------------------------------------------

def _width(console: Any) -> int:
    try:
        width = int(console.width)
    except (TypeError, ValueError, AttributeError):
        return DEFAULT_WIDTH
    return max(40, width) if width > 0 else DEFAULT_WIDTH


class PlainConsole:
    """The console where no colour can show (output not a terminal, NO_COLOR, TERM=dumb):
    each line written exactly as given, scrubbed once more. What the terminal layout
    needs of a console (`width`, `file`, `say`) without importing rich, a third of
    `explain`'s start; the text is the same rich writes to a file."""

    def __init__(self, stream: Any, width: int, anonymize: bool = False) -> None:
        from ..redact import Scrubber

        self.file = stream
        self.width = width
        self._scrub = Scrubber(anonymize).text

    def write_line(self, text: str) -> None:
        self.file.write(self._scrub(text, controls=True) + "\n")


def say(console: Any, *parts: tuple[str, str]) -> None:
    """One line, exactly as given: never wrapped, cropped or padded by rich."""
    if isinstance(console, PlainConsole):
        console.write_line("".join(text for text, _style in parts))
        return
    from rich.text import Text

    t = Text(no_wrap=True, overflow="ignore", end="\n")
    for text, style in parts:
        t.append(text, style=style or None)
    console.print(t, soft_wrap=True, crop=False)


def print_terminal(report: Report, console: Any, heading: str | None = None, *, anonymize: bool = False,
                   verbose: bool = False) -> None:
    """Plain indented output, one block per finding: header, title, why, evidence with
    line numbers, numbered fixes, references each on its own line."""
    from ..redact import scrub

    report = clean_report(report, anonymize)
    heading = scrub(heading, anonymize) if heading else heading
    width = _width(console)
    if heading:
        say(console, (heading, "bold"))
    if not report.findings:
        for line in wrap(("✓ " if not report.unrecognised else "") + _nothing_found(report), width):
            say(console, (line, "green" if not report.unrecognised else "yellow"))
    for n, f in enumerate(report.findings):
        if n or heading:
            say(console)
        count = f" ×{f.count}" if f.count > 1 else ""
        ranks = f" (ranks {', '.join(map(str, f.ranks))})" if f.ranks else ""
        say(console, (f"{SYMBOL[f.severity]} {f.severity}{count}{ranks}", STYLE[f.severity]),
             (f" · {f.category} · {f.rule}", "dim"))
        for line in wrap(f.title, width, indent=2):
            say(console, (line, "bold"))
        if f.explanation:
            for line in wrap(f.explanation, width, indent=2):
                say(console, (line, ""))
        for name, series in _series(f):
            say(console, (f"  {name}: ", "dim"), (sparkline(series), "cyan"),
                 (f"  {_num(series[0])} → {_num(series[-1])}", "dim"))
        if f.evidence:
            say(console, ("  Evidence", "bold"))
            for head, rest in evidence_lines(f.evidence, width):
                say(console, (head, "dim"), (rest, ""))
        if f.fixes:
            say(console, ("  Fix", "bold"))
            for i, fix in enumerate(f.fixes, 1):
                lines = wrap(fix, width, indent=4, first=f"{i}. ")
                say(console, (lines[0][:4 + len(f'{i}. ')], "bold"), (lines[0][4 + len(f'{i}. '):], ""))
                for line in lines[1:]:
                    say(console, (line, ""))
        if f.references:
            say(console, ("  See", "bold"))
            for r in f.references:
                say(console, ("    " + r, ""))
        facts = _facts_line(f)
        if facts and verbose:
            for line in wrap("facts: " + facts, width, indent=2):
                say(console, (line, "dim"))
    if report.unrecognised and report.findings:
        say(console)
    for u in report.unrecognised:
        lead = f"? not recognised, line {u.line}: "
        lines = wrap(u.exception + _unrecognised_tail(u), width, first=lead, rest="  ")
        say(console, (lead[:18], "yellow"), (lead[18:], "dim"), (lines[0][len(lead):], ""))
        for line in lines[1:]:
            say(console, (line, ""))
    if report.findings:
        say(console)
        say(console, (_summary(report), "bold"))


def _summary(report: Report) -> str:
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    return f"{len(report.findings)} finding(s): {errors} error, {warnings} warning, {infos} info"


def to_oneline(report: Report, where: str = "", *, anonymize: bool = False) -> str:
    """One line per finding, `WHERE:LINE: severity [rule] category: title`, the shape of
    compilers and linters (gcc, ruff --output-format concise) for CI logs and editors."""
    from ..redact import scrub

    report = clean_report(report, anonymize)
    where = scrub(where, anonymize)
    out = []
    for f in report.findings:
        # the line the finding was matched on (an exception's own line), not the
        # earliest line it cites (often the user's frame above it)
        first = next((e.line for e in f.evidence if e.line is not None), 0)
        loc = f"{where}:{first}" if first else (where or "mpdoctor")
        count = f" (×{f.count})" if f.count > 1 else ""
        out.append(f"{loc}: {f.severity} [{f.rule}] {f.category}: {' '.join(f.title.split())}{count}")
    for u in report.unrecognised:
        loc = f"{where}:{u.line}" if u.line else (where or "mpdoctor")
        out.append(f"{loc}: unrecognised {' '.join(u.exception.split())}{_unrecognised_tail(u)}")
    out.append(_summary(report) if report.findings else "no finding")
    return scrub("\n".join(out), anonymize) + "\n"


class _ScrubbingFile:
    """The console's file: every write scrubbed once more (a safety net under the
    renderers' own scrubbing, for text a face prints through rich directly)."""

    def __init__(self, stream: Any, anonymize: bool = False):
        from ..redact import Scrubber

        self._stream = stream
        self._scrub = Scrubber(anonymize).text

    def write(self, text: str) -> int:
        # the last step: secrets cut again, and no control character but rich's colours
        return self._stream.write(self._scrub(text, controls=False))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding ...
        return getattr(self._stream, name)


_PAD = _Lazy(r"[ \t]+((?:\x1b\[[0-9;]*m)*)$")


def print_unpadded(console: Any, renderable: Any) -> None:
    """Print a rich renderable (a Markdown page, a Table) without the spaces rich pads
    every line with to the full width."""
    with console.capture() as cap:
        console.print(renderable)
    text = "\n".join(_PAD.sub(r"\1", line) for line in cap.get().split("\n"))
    console.file.write(text)
    console.file.flush()


DEFAULT_WIDTH = 80


def terminal_columns(stream: Any = None) -> int:
    """The width to lay out for: COLUMNS when it is a positive number, else the
    terminal's own width when `stream` is one, else 80 (COLUMNS=0, a negative or a
    garbled value, a pipe, a terminal that reports 0 columns)."""
    import os

    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        if stream is not None and stream.isatty():
            columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns if columns > 0 else DEFAULT_WIDTH


def make_console(stderr: bool = False, anonymize: bool = False, *, plain_ok: bool = False) -> Any:
    """The console a face prints to. `plain_ok`: the caller only writes lines (say), so
    where no colour can show a PlainConsole does, without rich."""
    import os
    import sys

    stream = sys.stderr if stderr else sys.stdout
    if plain_ok and not os.environ.get("FORCE_COLOR"):
        try:
            colourless = (not stream.isatty() or "NO_COLOR" in os.environ
                          or os.environ.get("TERM") == "dumb")
        except (AttributeError, ValueError):
            colourless = True
        if colourless:
            return PlainConsole(stream, terminal_columns(stream), anonymize)
    from rich.console import Console

    # the width given, not read by rich (which takes COLUMNS=0 at its word: no output)
    console = Console(file=_ScrubbingFile(stream, anonymize), highlight=False, soft_wrap=False,
                      width=terminal_columns(stream))
    console.on_broken_pipe = _broken_pipe  # rich would exit 1 ("error found"); commands.guarded says 0
    return console


def _broken_pipe() -> None:
    raise BrokenPipeError("the reader of the output went away")


def emit(report: Report, fmt: str, *, stderr: bool = False, heading: str = "mpdoctor", anonymize: bool = False,
         verbose: bool = False, schema: str | None = None, where: str = "",
         environment: dict[str, str] | None = None) -> None:
    """Write the report in `fmt` to stdout (or stderr, for `run`): the one way out for
    explain and run, scrubbed of secrets (and anonymized with `anonymize`)."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    stream.write(render_text(report, fmt, heading=heading, anonymize=anonymize, verbose=verbose,
                             schema=schema, where=where, environment=environment, stderr=stderr)
                 if fmt != "terminal" else "")
    if fmt == "terminal":
        print_terminal(report, make_console(stderr=stderr, anonymize=anonymize, plain_ok=True), heading=None,
                       anonymize=anonymize, verbose=verbose)
    stream.flush()


def render_text(report: Report, fmt: str, *, heading: str = "mpdoctor", anonymize: bool = False,
                verbose: bool = False, schema: str | None = None, where: str = "",
                environment: dict[str, str] | None = None, stderr: bool = False, width: int | None = None) -> str:
    """The report as a string in `fmt` (what `--report FILE` writes): json, markdown,
    oneline, or the terminal layout without colours."""
    if fmt == "json":
        return to_json(report, schema=schema, anonymize=anonymize)
    if fmt == "markdown":
        return to_markdown(report, heading, anonymize=anonymize, verbose=verbose, environment=environment)
    if fmt == "oneline":
        return to_oneline(report, where, anonymize=anonymize)
    import io

    from rich.console import Console

    from ..redact import scrub

    buf = io.StringIO()
    width = width if isinstance(width, int) and width > 0 else DEFAULT_WIDTH
    console = Console(file=buf, width=width, no_color=True, highlight=False, color_system=None)
    print_terminal(report, console, heading=None, anonymize=anonymize, verbose=verbose)
    return scrub(buf.getvalue(), anonymize)
