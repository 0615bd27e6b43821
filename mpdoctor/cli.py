"""Argument parsing only: each face is a module of mpdoctor.commands."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from . import __version__
from .commands import COMMANDS, EXIT_CODES, guarded, load

MAIN_HELP = """\
mpdoctor diagnoses mixed-precision (fp16 / bf16 / fp8) training problems with
PyTorch and Hugging Face accelerate: it names the root cause, explains it with the
evidence from your own log and machine, and says what to change.

examples:
  mpdoctor explain train.log            # a traceback or a whole log -> root cause + fix
  python train.py 2>&1 | mpdoctor explain -
  mpdoctor check                        # is this machine ready for the precision I want?
  mpdoctor check --mixed-precision bf16
  mpdoctor collect -o env.json          # snapshot the environment ...
  mpdoctor check --snapshot env.json    # ... and judge it anywhere
  mpdoctor run -- python train.py       # wrap a failing run and diagnose it live
  mpdoctor probe                        # measure no/fp16/bf16/fp8 on this machine
  mpdoctor rules list                   # the knowledge base; `rules show ID`, `rules test`
"""


def add_output_options(p: argparse.ArgumentParser, formats: tuple[str, ...] = ("terminal", "json", "markdown", "oneline"),
                       report_options: bool = True) -> None:
    """--format and --rules, which every face that reports findings takes; with
    `report_options`, also --anonymize and -v (faces whose output carries the user's
    paths and logs)."""
    helps = {"terminal": "terminal (default)", "json": "json (versioned, for scripts: docs/json-*.md)",
             "markdown": "markdown (for a GitHub issue)", "oneline": "oneline (one line per finding, for CI logs)"}
    p.add_argument("--format", choices=formats, default="terminal",
                   help=", ".join(helps[f] for f in formats))
    p.add_argument("--rules", action="append", default=[], metavar="DIR",
                   help="also load the rules in DIR (repeatable; MPDOCTOR_RULES_PATH works too)")
    if report_options:
        p.add_argument("--anonymize", action="store_true",
                       help="also hide the home directory (as ~), the user name and the host name; "
                            "secrets (tokens, passwords, URL credentials) are always redacted")
        p.add_argument("-v", "--verbose", action="store_true",
                       help="also show each finding's facts (the values its sentences were made from)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the chosen command's module is imported for its options (the
    others get their name and summary: `explain` must not pay for `probe`'s parser)."""
    parser = argparse.ArgumentParser(
        prog="mpdoctor", description=MAIN_HELP, epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mpdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, summary) in COMMANDS.items():
        if only is None or only == name:
            module = load(name)
            p = sub.add_parser(name, help=summary, description=module.DESCRIPTION, epilog=module.EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
            module.add_arguments(p)
            p.set_defaults(_main=module.main)
        else:
            sub.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args: Any = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return guarded(args._main, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
