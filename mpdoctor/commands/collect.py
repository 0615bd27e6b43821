"""`mpdoctor collect`: this machine's environment as a versioned JSON snapshot."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from typing import Any

from . import EXIT_OK, fail

DESCRIPTION = ("Write the environment (hardware, driver, torch, libraries, accelerate\n"
               "config) as versioned JSON, secrets redacted.\n\n"
               "  mpdoctor collect -o env.json\n  mpdoctor collect --anonymize")
EPILOG = "exit status:\n  0  the snapshot was written\n  2  the arguments are wrong or the file cannot be written\n"


def add_arguments(p: Any) -> None:
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--config-file", metavar="FILE", help="the accelerate config file to read")
    p.add_argument("--anonymize", action="store_true", help="also replace the user name and home in paths")


def main(args: Namespace) -> int:
    from ..env import collect
    from .check import config_file_problem

    problem = config_file_problem(args.config_file)
    if problem:
        return fail(problem)
    snapshot = collect(config_file=args.config_file, anonymize=args.anonymize)
    text = json.dumps(snapshot, indent=2, ensure_ascii=False) + "\n"
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            return fail(f"cannot write {args.output}: {exc.strerror}")
        sys.stderr.write(f"mpdoctor: snapshot written to {args.output}\n")
    else:
        sys.stdout.write(text)
    return EXIT_OK
