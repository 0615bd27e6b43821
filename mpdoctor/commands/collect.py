"""`mpdoctor collect`: this machine's environment as a versioned JSON snapshot."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from typing import Any

from . import EXIT_OK, env_help, fail

DESCRIPTION = ("Write the environment (hardware, driver, torch, libraries, accelerate\n"
               "config) as versioned JSON, secrets redacted.\n\n"
               "  mpdoctor collect -o env.json\n  mpdoctor collect --anonymize\n"
               "  mpdoctor collect --python ~/venvs/train/bin/python  # the env that trains")
EPILOG = ("exit status:\n  0  the snapshot was written\n  2  the arguments are wrong or the file cannot be written\n"
          + env_help("MPDOCTOR_TORCH_TIMEOUT", "MPDOCTOR_NVML_TIMEOUT", "MPDOCTOR_DEBUG"))


def add_arguments(p: Any) -> None:
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--config-file", metavar="FILE", help="the accelerate config file to read")
    p.add_argument("--anonymize", action="store_true", help="also hide the home directory (as ~), the user name and the host name; "
                                                          "secrets are always redacted")
    from .check import add_python_option

    add_python_option(p)


def main(args: Namespace) -> int:
    from ..env import collect
    from .check import config_file_problem, python_option_problem

    problem = config_file_problem(args.config_file) or python_option_problem(args)
    if problem:
        return fail(problem)
    from ..env import SnapshotError

    try:
        snapshot = collect(config_file=args.config_file, anonymize=args.anonymize, python=getattr(args, "python", None))
    except SnapshotError as exc:  # what a collector child answered cannot be used
        return fail(f"this machine's environment could not be read: {exc}")
    from ..redact import redact_snapshot

    snapshot = redact_snapshot(snapshot)  # the one gate every output passes (idempotent)
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
