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


def add_output_options(p: argparse.ArgumentParser) -> None:
    """--format and --rules, which every face that reports findings takes."""
    p.add_argument("--format", choices=("terminal", "json", "markdown"), default="terminal",
                   help="terminal (default, rich), json (stable, for scripts), markdown (for a GitHub issue)")
    p.add_argument("--rules", action="append", default=[], metavar="DIR",
                   help="also load the rules in DIR (repeatable; MPDOCTOR_RULES_PATH works too)")


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
