"""`mpdoctor run -- CMD`: run a training command untouched, then diagnose it."""

from __future__ import annotations

import argparse
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from . import fail, load_rules_or_fail

DESCRIPTION = (
    "Run COMMAND with its terminal passed through untouched, watch torch/accelerate\n"
    "inside it (NaN/Inf, overflow, loss scale, OOM, dtype/device mismatches, the\n"
    "precision that really ran), and diagnose it with the rule base. The exit status is\n"
    "the command's own.\n\n"
    "  mpdoctor run -- python train.py --lr 3e-4\n"
    "  mpdoctor run -- accelerate launch train.py\n"
    "  mpdoctor run --report report.json -- torchrun --nproc-per-node 2 train.py"
)
EPILOG = ("exit status:\n  the command's own (a signal S gives 128+S, as in a shell); 126/127 when it cannot\n"
          "  be started; 2 when mpdoctor's own arguments or rules are wrong\n")


def add_arguments(p: Any) -> None:
    from ..cli import add_output_options

    add_output_options(p)
    p.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument("--no-probe", action="store_true", help="do not instrument the child, only read its output")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def main(args: Namespace) -> int:
    from ..run.diagnose import diagnose
    from ..run.wrapper import CommandNotRunnable, run_command

    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return fail("run: no command given; usage: mpdoctor run [--report FILE] -- COMMAND ...")
    rules = load_rules_or_fail(args.rules)  # a broken rule is said before the training starts
    if isinstance(rules, int):
        return rules
    try:
        result, records = run_command(cmd, instrument=not args.no_probe)
    except CommandNotRunnable as exc:
        sys.stderr.write(f"mpdoctor run: {exc}\n")
        return exc.status
    report = diagnose(cmd, result, records, rules)
    _deliver(report, result, args)
    return result.exit_code


def _deliver(report: Any, result: Any, args: Namespace) -> None:
    from .. import render

    if args.report:
        try:
            Path(args.report).write_text(render.to_json(report), encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(f"mpdoctor run: cannot write the report {args.report}: {exc}\n")
    if not report.worth_showing(result.exit_code) and args.format == "terminal":
        return
    if result.signal_name:
        sys.stderr.write(f"mpdoctor: the command was killed by {result.signal_name} "
                         f"(exit status {result.exit_code})\n")
    try:
        render.emit(report, args.format, stderr=True, heading=f"mpdoctor run (exit status {result.exit_code})")
    except BrokenPipeError:
        pass
