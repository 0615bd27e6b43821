"""`mpdoctor explain`: a traceback or a whole log in, ranked findings out."""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from argparse import Namespace
    from typing import Any

from . import EXIT_CODES, EXIT_ERROR_FINDING, EXIT_OK, env_help, fail, load_rules_or_fail

DESCRIPTION = (
    "Read a traceback or a whole training log (any size; ANSI colours, progress\n"
    "bars, rank prefixes and rich boxes are fine) and report what went wrong, root\n"
    "cause first: the rule, its category, why it happens, what to change, and the\n"
    "exact log lines.\n\n"
    "  mpdoctor explain train.log\n"
    "  torchrun ... 2>&1 | mpdoctor explain -\n"
    "  mpdoctor explain crash.txt --format markdown   # paste into an issue\n"
    "  mpdoctor explain train.log --format json       # stable, for scripts\n"
    "  mpdoctor explain train.log --format oneline    # a line per finding (CI)\n"
    "  mpdoctor explain train.log --here --format markdown --anonymize\n\n"
    "With `-` and a terminal on standard input, paste the log and end it with\n"
    "Ctrl-D. Secrets in the log (tokens, passwords, URL credentials) never reach\n"
    "the output; --anonymize also hides the home directory, user and host names."
)
EPILOG = EXIT_CODES + env_help("MPDOCTOR_RULES_PATH", "MPDOCTOR_CACHE_DIR", "MPDOCTOR_NO_CACHE",
                                  "MPDOCTOR_NO_HYPERSCAN", "MPDOCTOR_PROGRESS_AFTER", "MPDOCTOR_TORCH_TIMEOUT",
                                  "MPDOCTOR_NVML_TIMEOUT",
                                  "MPDOCTOR_DEBUG", "NO_COLOR")


def add_arguments(p: Any) -> None:
    from . import add_output_options

    p.add_argument("path", metavar="PATH", nargs="+",
                   help="the log file, or - for standard input; several files, a folder or a glob are read "
                        "as one job (each rank's log, run reports of several nodes, Flight Recorder dumps)")
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
    paths = args.path if isinstance(args.path, list) else [args.path]
    if len(paths) > 1 or os.path.isdir(paths[0]) or (not os.path.exists(paths[0]) and "*" in paths[0]):
        return _explain_job(args, paths)
    args.path = paths[0]
    from ..logs import InputError, explain_path
    from ..render import SCHEMAS, emit

    if args.path == "-":
        if sys.stdin is None:  # started with `<&-`
            return fail("standard input is closed: give a log file, or pipe a log in (`... 2>&1 | mpdoctor explain -`)")
        if sys.stdin.isatty() and sys.stderr is not None:  # a person at a terminal, not a pipe
            sys.stderr.write("mpdoctor: reading the log from standard input (paste it, then Ctrl-D on a line "
                             "of its own; Ctrl-C to stop)\n")
            sys.stderr.flush()
    rules = load_rules_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    from ..redact import scrub

    progress = ProgressLine("standard input" if args.path == "-" else scrub(os.path.basename(args.path),
                                                                             args.anonymize))
    try:
        report = explain_path(args.path, rules, progress)
    except InputError as exc:
        progress.done()
        return fail(str(exc))
    progress.done()
    environment = None
    if args.snapshot or args.here:
        try:
            snap = _sharpen(report, args.snapshot, args.here, rules)
        except (OSError, ValueError) as exc:
            return fail(f"cannot use the snapshot: {exc}")
        if args.format == "markdown":
            from ..render import environment_from_snapshot

            environment = environment_from_snapshot(snap)
    where = "<stdin>" if args.path == "-" else args.path
    emit(report, args.format, heading=f"mpdoctor explain {report.input.get('path', '')}".strip(),
         anonymize=args.anonymize, verbose=args.verbose, schema=SCHEMAS["explain"], where=where,
         environment=environment)
    return EXIT_ERROR_FINDING if report.has_error else EXIT_OK


def _explain_job(args: Namespace, paths: list[str]) -> int:
    """Several files, a folder or a glob: the job read as one (mpdoctor.job)."""
    if "-" in paths:
        return fail("explain: standard input (-) is one log; give a job's files or folder without it")
    rules = load_rules_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    from ..job import explain_job
    from ..job.sources import SourceError
    from ..redact import scrub
    from ..render import SCHEMAS, emit

    name = scrub(os.path.basename(os.path.normpath(paths[0])), args.anonymize) + (" ..." if len(paths) > 1 else "")
    progress = ProgressLine(name)
    try:
        report = explain_job(paths, rules, progress)
    except SourceError as exc:
        progress.done()
        return fail(str(exc))
    progress.done()
    heading = f"mpdoctor explain {' '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}"
    emit(report, args.format, heading=heading, anonymize=args.anonymize, verbose=args.verbose,
         schema=SCHEMAS["explain"], where=paths[0])
    return EXIT_ERROR_FINDING if report.has_error else EXIT_OK


def _sharpen(report: Any, snapshot_path: str | None, here: bool, rules: Any) -> dict[str, Any]:
    """Sharpen the findings with a snapshot (the file, or this machine collected once);
    the snapshot is returned for the markdown environment block."""
    from ..diagnosis.sharpen import sharpen_with
    from ..env import collect, load_snapshot

    snap = load_snapshot(snapshot_path) if snapshot_path else collect()
    sharpen_with(report, snap, snapshot_path or "live", rules)
    return snap
