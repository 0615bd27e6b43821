"""mpdoctor in IPython and Jupyter: `%load_ext mpdoctor`.

Once loaded:

* a cell that raises is followed by mpdoctor's diagnosis of that error (markdown in
  Jupyter, plain text in a terminal IPython), made by the same log pipeline as
  `mpdoctor explain` from the cell's own traceback and the output and warnings it printed
  before failing; an error no rule knows adds nothing to the cell;
* `%mpdoctor check [options]` shows `mpdoctor check` (same options) in the notebook;
  `%mpdoctor last` explains the last exception; `%mpdoctor explain FILE-OR-TEXT` and
  `%%mpdoctor explain` (the cell is the log) explain a log;
* a `mpdoctor.watch()` handle, and the Report its `report()` returns, display as the
  markdown report when they are a cell's value.

Only IPython imports this module (through `mpdoctor.load_ipython_extension`); the
command line never does. It fails open: an error of its own is one line on stderr, and
the user's cell, its error and the kernel are left as they were.
"""

from __future__ import annotations

import sys
from typing import Any

MAGIC_USAGE = (
    "usage: %mpdoctor check [check options] | %mpdoctor last | %mpdoctor explain FILE-OR-TEXT\n"
    "       %%mpdoctor explain   (the cell below is the log)"
)
_OUTPUT_KEPT = 64 * 1024  # characters of a cell's output kept as context (its last ones)
# the types shown as a markdown report: the Report, and the handle watch() returns
_REPORTED = (("mpdoctor.findings", "Report"), ("mpdoctor.api", "Watcher"))

_ACTIVE: NotebookDoctor | None = None
_MISSING = object()


def load_ipython_extension(ipython: Any) -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.close()
    _ACTIVE = NotebookDoctor(ipython)
    _ACTIVE.open()


def unload_ipython_extension(ipython: Any) -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.close()
        _ACTIVE = None


def _log_pipeline() -> tuple[Any, Any, Any]:
    """(explain_text, explain_path, InputError) of mpdoctor's log pipeline, the one
    `mpdoctor explain` runs: the one place this module names it, imported on first use."""
    from .logs import InputError, explain_path, explain_text

    return explain_text, explain_path, InputError


def _note(what: str, exc: BaseException) -> None:
    """The one line an error of mpdoctor's own leaves (never a traceback)."""
    try:
        from .redact import redact_text

        detail = redact_text(f"{type(exc).__name__}: {exc}")
    except Exception:
        detail = type(exc).__name__
    try:
        sys.stderr.write(f"mpdoctor: {what} ({detail.splitlines()[0] if detail else ''})\n")
    except Exception:
        pass


class _Kept:
    """The last `_OUTPUT_KEPT` characters a cell wrote (stdout and stderr interleaved as
    written): at most about twice that is ever held."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def add(self, text: str) -> None:
        self.parts.append(text[-_OUTPUT_KEPT:])
        self.size += len(self.parts[-1])
        if self.size > 2 * _OUTPUT_KEPT:
            self.parts = [self.text()]
            self.size = len(self.parts[0])

    def text(self) -> str:
        return "".join(self.parts)[-_OUTPUT_KEPT:]


class _Tee:
    """Keeps what is written to a stream while the stream writes it as before. Set as
    the stream's own `write` attribute, so `sys.stdout` stays the same object
    (isinstance checks, ipykernel's thread handling untouched)."""

    def __init__(self, stream: Any, kept: _Kept) -> None:
        self.stream = stream
        self.kept = kept
        self.original = stream.write  # called first, whatever happens here
        self.prior = getattr(stream, "__dict__", {}).get("write", _MISSING)

    def __call__(self, text: Any) -> Any:
        written = self.original(text)
        try:
            if isinstance(text, str) and text:
                self.kept.add(text)
        except Exception:
            pass
        return written

    def install(self) -> bool:
        try:
            self.stream.write = self
            return True
        except Exception:  # a stream that takes no attribute: its output is not context
            return False

    def uninstall(self) -> None:
        try:
            if self.stream.__dict__.get("write") is not self:
                return  # replaced since: left to whoever did it
            if self.prior is _MISSING:
                del self.stream.write
            else:
                self.stream.write = self.prior
        except Exception:
            pass


class NotebookDoctor:
    """The extension's state in one shell: the hooks, the magic, the formatters."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.rules: Any = None
        self.output = _Kept()
        self.tees: list[_Tee] = []
        self.last: tuple[BaseException, str, str] | None = None  # (exception, log text, cell label)

    # --- wiring ----------------------------------------------------------------------

    def open(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self.shell.register_magic_function(self.magic, magic_kind="line_cell", magic_name="mpdoctor")
        formatters = self.shell.display_formatter.formatters
        for module, name in _REPORTED:
            formatters["text/markdown"].for_type_by_name(module, name, self._markdown_of)
            if not self._rich_frontend():
                formatters["text/plain"].for_type_by_name(module, name, self._pretty_of)

    def close(self) -> None:
        self._stop_capture()
        for event, callback in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            try:
                self.shell.events.unregister(event, callback)
            except ValueError:
                pass
        for kind in ("line", "cell"):
            self.shell.magics_manager.magics[kind].pop("mpdoctor", None)
        formatters = self.shell.display_formatter.formatters
        for mime in ("text/markdown", "text/plain"):
            for module, name in _REPORTED:
                formatters[mime].pop(f"{module}.{name}", None)

    def _rich_frontend(self) -> bool:
        """Jupyter (and Colab, VS Code): a kernel shows markdown; a terminal IPython does not."""
        return getattr(self.shell, "kernel", None) is not None

    # --- a cell's output and its error -------------------------------------------------

    def pre_run_cell(self, info: Any = None) -> None:
        try:
            self._stop_capture()
            self.output = _Kept()
            for stream in (sys.stdout, sys.stderr):
                tee = _Tee(stream, self.output)
                if tee.install():
                    self.tees.append(tee)
        except Exception as exc:
            _note("the cell's output is not kept as context", exc)

    def _stop_capture(self) -> None:
        for tee in reversed(self.tees):
            tee.uninstall()
        self.tees = []

    def post_run_cell(self, result: Any) -> None:
        try:
            self._stop_capture()
            exc = getattr(result, "error_in_exec", None)
            if exc is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
                return
            count = getattr(result, "execution_count", None)
            label = f"Cell In[{count}]" if count is not None else "this cell"
            text = self.output.text()
            if text and not text.endswith("\n"):
                text += "\n"
            text += self._traceback_text(exc)
            self.last = (exc, text, label)
            report = self._explain(text)
            if report.findings:  # an error no rule knows adds nothing to the cell
                self._show(report, f"mpdoctor explain {label}")
        except (Exception, KeyboardInterrupt) as exc:
            _note("no diagnosis for this cell; its error above is unchanged", exc)
        finally:
            self.output = _Kept()

    def _traceback_text(self, exc: BaseException) -> str:
        """The exception as Python prints it (what the rules read), without IPython's
        own frame, cells named as IPython names them (`Cell In[3]`)."""
        import traceback

        tb = exc.__traceback__
        if tb is not None and tb.tb_frame.f_code.co_filename.endswith("interactiveshell.py"):
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        names = getattr(getattr(self.shell, "compile", None), "_filename_map", None) or {}
        for filename, number in names.items():
            if filename in text:
                text = text.replace(f'File "{filename}"', f'File "Cell In[{number}]"')
        return text

    def _explain(self, text: str) -> Any:
        explain_text, _, _ = _log_pipeline()
        return explain_text(text, self._rules())

    def _rules(self) -> Any:
        if self.rules is None:
            from .rulebase import load

            self.rules = load()
        return self.rules

    # --- showing ------------------------------------------------------------------------

    def _show(self, report: Any, heading: str) -> None:
        from IPython.display import display

        from .render import render_text

        bundle = {"text/plain": render_text(report, "terminal", width=self._width()).rstrip("\n")}
        if self._rich_frontend():
            bundle["text/markdown"] = render_text(report, "markdown", heading=heading)
        display(bundle, raw=True)

    def _width(self) -> int | None:
        if self._rich_frontend():
            return None
        from .render import terminal_columns

        return terminal_columns(sys.__stdout__)

    def _report_of(self, obj: Any) -> Any:
        return obj.report() if hasattr(obj, "findings") and callable(getattr(obj, "report", None)) else obj

    def _markdown_of(self, obj: Any) -> str | None:
        try:
            from .render import render_text

            heading = "mpdoctor watch" if type(obj).__name__ == "Watcher" else "mpdoctor"
            return render_text(self._report_of(obj), "markdown", heading=heading)
        except Exception as exc:
            _note("this value is shown as its repr", exc)
            return None

    def _pretty_of(self, obj: Any, printer: Any, cycle: bool) -> None:
        try:
            from .render import render_text

            printer.text(render_text(self._report_of(obj), "terminal", width=self._width()).rstrip("\n"))
        except Exception as exc:
            _note("this value is shown as its repr", exc)
            printer.text(repr(obj))

    # --- %mpdoctor ------------------------------------------------------------------------

    def magic(self, line: str = "", cell: str | None = None) -> None:
        try:
            command, _, rest = (line or "").strip().partition(" ")
            rest = rest.strip()
            if command == "check":
                self._check(rest)
            elif command == "last":
                self._last()
            elif command == "explain" and (cell is not None or rest):
                self._explain_magic(cell if cell is not None else rest)
            else:
                sys.stderr.write(MAGIC_USAGE + "\n")
        except (Exception, KeyboardInterrupt) as exc:
            _note(f"%mpdoctor {(line or '').strip().split(' ')[0]} failed", exc)

    def _check(self, rest: str) -> None:
        """`mpdoctor check` itself (its options, its collectors, its renderer): markdown in
        Jupyter, the terminal checklist in a terminal IPython."""
        import shlex

        from .cli import main

        argv = ["check", *shlex.split(rest)]
        if not self._rich_frontend() or "--format" in rest:
            self._run_cli(main, argv)
            return
        import contextlib
        import io

        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            self._run_cli(main, [*argv, "--format", "markdown"])
        if captured.getvalue():
            from IPython.display import display

            display({"text/markdown": captured.getvalue(), "text/plain": captured.getvalue()}, raw=True)

    @staticmethod
    def _run_cli(main: Any, argv: list[str]) -> None:
        try:
            main(argv)
        except SystemExit:  # argparse's own message (usage, --help) is already on stderr/stdout
            pass

    def _last(self) -> None:
        exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if exc is None:
            sys.stderr.write("mpdoctor: no exception in this session yet\n")
            return
        if self.last is not None and self.last[0] is exc:
            _, text, label = self.last
        else:
            label = "the last exception"
            if getattr(exc, "__traceback__", None) is None and getattr(sys, "last_traceback", None) is not None:
                exc = exc.with_traceback(sys.last_traceback)
            text = self._traceback_text(exc)
        self._show(self._explain(text), f"mpdoctor explain {label}")

    def _explain_magic(self, source: str) -> None:
        """A path (one word that names a file, or looks like one) is read as `mpdoctor
        explain PATH` reads it; anything else is the log itself."""
        import os
        import re

        stripped = source.strip()
        one_word = bool(stripped) and not re.search(r"\s", stripped)
        path = os.path.expanduser(stripped)
        if one_word and (os.path.exists(path) or "/" in stripped or re.search(r"\.(log|txt|out|err)$", stripped)):
            from .commands import fail

            _, explain_path, InputError = _log_pipeline()
            if not os.path.exists(path):
                fail(f"{stripped}: no such file")
                return
            try:
                report = explain_path(path, self._rules())
            except InputError as exc:
                fail(str(exc))
                return
            self._show(report, f"mpdoctor explain {stripped}")
        else:
            self._show(self._explain(source), "mpdoctor explain")
