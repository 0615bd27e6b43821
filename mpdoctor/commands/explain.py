"""`mpdoctor explain`: a traceback or a whole log in, ranked findings out."""

from __future__ import annotations

import os
import sys
import time
from argparse import Namespace
from typing import Any

from . import EXIT_CODES, EXIT_ERROR_FINDING, EXIT_OK, fail, load_rules_or_fail

DESCRIPTION = (
    "Read a traceback or a whole training log (any size; ANSI colours, progress bars,\n"
    "rank prefixes and rich boxes are fine) and report what went wrong, root cause first:\n"
    "the rule, its category, why it happens, what to change, and the exact log lines.\n\n"
    "  mpdoctor explain train.log\n"
    "  torchrun ... 2>&1 | mpdoctor explain -\n"
    "  mpdoctor explain crash.txt --format markdown   # paste into an issue\n"
    "  mpdoctor explain train.log --format json       # stable, for scripts\n\n"
    "Your own rules: --rules DIR or MPDOCTOR_RULES_PATH=DIR[:DIR...] (see `mpdoctor rules`).\n"
    "Colours follow the terminal; NO_COLOR=1 turns them off."
)
EPILOG = EXIT_CODES


def add_arguments(p: Any) -> None:
    from ..cli import add_output_options

    p.add_argument("path", metavar="PATH", help="the log file, or - for standard input")
    add_output_options(p)
    p.add_argument("--snapshot", metavar="FILE",
                   help="an environment snapshot (mpdoctor collect) to sharpen the explanation")
    p.add_argument("--here", action="store_true",
                   help="collect this machine's environment and use it to sharpen the explanation")


class ProgressLine:
    """'reading train.log: 312 MB of 500 MB (62%)' on stderr, only when stderr is a
    terminal and only once reading has taken a moment (MPDOCTOR_PROGRESS_AFTER seconds,
    1.5 by default), so that short runs and pipes never see it."""

    def __init__(self, name: str, stream=None):
        self.name = name
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        try:
            self.after = float(os.environ.get("MPDOCTOR_PROGRESS_AFTER", "1.5"))
        except ValueError:
            self.after = 1.5
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False
        self.last = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.started < self.after or now - self.last < 0.2:
            return
        self.last = now
        mb = done / 1e6
        if total:
            text = f"reading {self.name}: {mb:,.0f} MB of {total / 1e6:,.0f} MB ({100 * done / total:.0f}%)"
        else:
            text = f"reading {self.name}: {mb:,.0f} MB"
        self.stream.write(f"\rmpdoctor: {text}\x1b[K")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def main(args: Namespace) -> int:
    from ..explain import explain_path
    from ..render import emit
    from ..scan import InputError

    rules = load_rules_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    progress = ProgressLine("standard input" if args.path == "-" else os.path.basename(args.path))
    try:
        report = explain_path(args.path, rules, progress)
    except InputError as exc:
        progress.done()
        return fail(str(exc))
    progress.done()
    if args.snapshot or args.here:
        from ..env.sharpen import sharpen_report

        try:
            sharpen_report(report, snapshot_path=args.snapshot, here=args.here)
        except (OSError, ValueError) as exc:
            return fail(f"cannot use the snapshot: {exc}")
    emit(report, args.format, heading=f"mpdoctor explain {report.input.get('path', '')}".strip())
    return EXIT_ERROR_FINDING if report.has_error else EXIT_OK
