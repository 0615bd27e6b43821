"""`mpdoctor run -- CMD`: run a training command untouched, then diagnose it."""

from __future__ import annotations

import argparse
import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from . import env_help, fail, load_rules_or_fail

DESCRIPTION = (
    "Run COMMAND with its terminal passed through untouched, watch torch/accelerate\n"
    "inside it (NaN/Inf, overflow, loss scale, OOM, dtype/device mismatches, the\n"
    "precision that really ran), and diagnose it with the rule base. The exit\n"
    "status is the command's own.\n\n"
    "  mpdoctor run -- python train.py --lr 3e-4\n"
    "  mpdoctor run -- accelerate launch train.py\n"
    "  mpdoctor run --report report.json -- torchrun --nproc-per-node 2 train.py"
)
EPILOG = ("exit status:\n  the command's own (a signal S gives 128+S, as in a shell); 126/127 when it\n"
          "  cannot be started; 2 when mpdoctor's own arguments or rules are wrong;\n"
          "  3 with --fail-on SEVERITY when the command exited 0 but mpdoctor found a\n"
          "  problem of that severity or worse (a failed command keeps its own status)\n")
EPILOG += env_help("MPDOCTOR_WATCH_EVERY", "MPDOCTOR_SAVE_EVENTS", "MPDOCTOR_INSTRUMENT_FAIL",
                   "MPDOCTOR_RULES_PATH", "MPDOCTOR_CACHE_DIR", "MPDOCTOR_NO_CACHE", "MPDOCTOR_DEBUG", "NO_COLOR")
EXIT_FAIL_ON = 3


def add_arguments(p: Any) -> None:
    from . import add_output_options

    add_output_options(p)
    p.add_argument("--report", metavar="FILE",
                   help="also write the report to FILE, in --format (json when --format is terminal, "
                        "markdown for a FILE ending in .md)")
    p.add_argument("--job-dir", metavar="DIR", default=None,
                   help="a folder shared by every node of a multi-node job (also MPDOCTOR_JOB_DIR): this node's "
                        "report (with its host, ranks, environment and precision plan) and its ranks' Flight "
                        "Recorder dumps go there; `mpdoctor explain DIR` diagnoses the job")
    p.add_argument("--fail-on", choices=("error", "warning"), default=None, metavar="{error,warning}",
                   help="exit 3 when the command passed but mpdoctor found a problem of this severity or worse")
    p.add_argument("--no-instrument", dest="no_probe", action="store_true",
                   help="do not instrument the command, only read its output")
    # the old name (it read as the `probe` command), kept working and out of --help
    p.add_argument("--no-probe", dest="no_probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def main(args: Namespace) -> int:
    from ..diagnosis.run import diagnose
    from ..run.wrapper import CommandNotRunnable, run_command

    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return fail("run: no command given; usage: mpdoctor run [--report FILE] -- COMMAND ...")
    every = os.environ.get("MPDOCTOR_WATCH_EVERY", "").strip()
    if every and not (every.isdigit() and int(every) >= 1):
        return fail(f"MPDOCTOR_WATCH_EVERY={every!r}: give a whole number of steps, 1 or more "
                    "(1 watches every step)")
    if args.report:
        bad = _unwritable(args.report)
        if bad:  # said before the training starts, not after hours of it
            return fail(f"run: cannot write the report {args.report}: {bad}")
    job_dir = getattr(args, "job_dir", None) or os.environ.get("MPDOCTOR_JOB_DIR") or None
    if job_dir:
        from ..job.collect import prepare_job_dir

        bad = prepare_job_dir(job_dir)
        if bad:
            return fail(f"run: cannot use the job folder {job_dir}: {bad}")
    rules = load_rules_or_fail(args.rules)  # a broken rule is said before the training starts
    if isinstance(rules, int):
        return rules
    try:
        result, records = run_command(cmd, instrument=not args.no_probe)
    except CommandNotRunnable as exc:
        try:
            sys.stderr.write(f"mpdoctor run: {exc}\n")
            sys.stderr.flush()
        except (OSError, AttributeError):  # full, or closed (sys.stderr is None)
            pass
        return exc.status
    report = diagnose(cmd, result, records, rules)
    report.extra["log_tail"] = last_lines(result.tail.text())
    if job_dir:  # this node's part of the job: its host, ranks, environment, plan
        from ..job.collect import write_node_report

        write_node_report(job_dir, report, cmd, result, records, anonymize=getattr(args, "anonymize", False))
    why = result.extra.get("not_instrumented")
    if why:  # the command ran; what the instrumentation would have seen is missing
        report.input["instrumented"] = False
        report.input["not_instrumented"] = why
    _deliver(report, result, args)
    return _exit_status(report, result.exit_code, getattr(args, "fail_on", None))


LOG_TAIL_LINES, LOG_LINE_CHARS = 30, 300


def last_lines(text: str, n: int = LOG_TAIL_LINES, width: int = LOG_LINE_CHARS) -> list[str]:
    """The last `n` non-empty lines of the command's output, as a terminal left them (a
    progress bar's carriage returns keep its last state), each cut at `width`
    characters: bounded whatever the log. Secrets are cut by the renderers."""
    from ..redact import clip

    out: list[str] = []
    for line in reversed(text.split("\n")):
        line = line.rstrip()  # "\r\n" endings and trailing blanks
        line = line.rsplit("\r", 1)[-1]  # a progress bar redrawn in place: its last state
        if line:
            out.append(clip(line, width) if len(line) > width else line)
            if len(out) == n:
                break
    return out[::-1]


def _unwritable(path: str) -> str | None:
    """Why the report cannot be written at `path` (its folder missing or not writable,
    the path a folder), or None; checked before the command starts."""
    target = Path(path)
    if target.is_dir():
        return "it is a folder"
    folder = target.parent
    if not folder.is_dir():
        return f"no folder {folder}"
    if target.exists():
        ok = os.access(target, os.W_OK)
    else:
        ok = os.access(folder, os.W_OK | os.X_OK)
    if not ok:
        return "Permission denied"
    try:  # a read-only filesystem passes access() for root: ask the filesystem itself
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "Read-only file system"
    except (OSError, AttributeError):
        pass
    return None


def _exit_status(report: Any, code: int, fail_on: str | None) -> int:
    """The command's own status; with --fail-on, 3 for a passed command mpdoctor finds broken."""
    if code != 0 or not fail_on:
        return code
    worst = {"error": ("error",), "warning": ("error", "warning")}[fail_on]
    if any(f.severity in worst and f.rule not in report.quiet_rules for f in report.findings):
        return EXIT_FAIL_ON
    return code


def _deliver(report: Any, result: Any, args: Namespace) -> None:
    from .. import render
    from ..env.host import environment_light

    if args.report:
        try:
            fmt = args.format if args.format != "terminal" else (
                "markdown" if args.report.lower().endswith((".md", ".markdown")) else "json")
            Path(args.report).write_text(render.render_text(
                report, fmt, heading=f"mpdoctor run (exit status {result.exit_code})",
                anonymize=getattr(args, "anonymize", False), verbose=getattr(args, "verbose", False),
                schema=render.SCHEMAS["run"], where="run",
                environment=environment_light() if fmt == "markdown" else None), encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(f"mpdoctor run: cannot write the report {args.report}: {exc}\n")
    why = result.extra.get("not_instrumented")
    if why and args.format == "terminal" and sys.stderr is not None:  # json, markdown: in the report's input
        try:
            sys.stderr.write(f"mpdoctor run: not instrumented: {why}; the diagnosis read the command's "
                             "output only (set TMPDIR to a writable folder to instrument it)\n")
            sys.stderr.flush()
        except OSError:
            pass
    if not report.worth_showing(result.exit_code) and args.format == "terminal":
        return
    if sys.stderr is None:  # started with it closed (2>&-): nowhere to say it
        return
    try:  # our stderr full or closed: the command's status still passes through
        if result.signal_name:
            sys.stderr.write(f"mpdoctor: the command was killed by {result.signal_name} "
                             f"(exit status {result.exit_code})\n")
        render.emit(report, args.format, stderr=True, heading=f"mpdoctor run (exit status {result.exit_code})",
                    anonymize=getattr(args, "anonymize", False), verbose=getattr(args, "verbose", False),
                    schema=render.SCHEMAS["run"], where="run",
                    environment=environment_light() if args.format == "markdown" else None)
    except OSError:  # EPIPE, ENOSPC (2>/dev/full), EIO
        pass
