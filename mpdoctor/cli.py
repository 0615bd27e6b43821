"""Argument parsing only: each face is a module of mpdoctor.commands."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    import argparse
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


def _terminal_columns() -> int:
    """`shutil.get_terminal_size().columns`, as argparse asks it for every parser and
    argument, without importing shutil (with bz2, lzma, zlib: a few ms of the start)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


_FORMATTERS: tuple[type, type] | None = None


def formatters() -> tuple[type, type]:
    """argparse's HelpFormatter and RawDescriptionHelpFormatter, the width found as
    argparse finds it (less 2), minus the import of shutil; made on first use, so that
    the fast path of `explain` (below) does not import argparse."""
    global _FORMATTERS
    if _FORMATTERS is None:
        import argparse

        class HelpFormatter(argparse.HelpFormatter):
            def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                         width: int | None = None, **kwargs: Any) -> None:
                super().__init__(prog, indent_increment, max_help_position,
                                 _terminal_columns() - 2 if width is None else width, **kwargs)

        class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
            pass

        _FORMATTERS = (HelpFormatter, RawDescriptionHelpFormatter)
    return _FORMATTERS


OUTPUT_FORMATS = ("terminal", "json", "markdown", "oneline")


def add_output_options(p: argparse.ArgumentParser, formats: tuple[str, ...] = OUTPUT_FORMATS,
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
    import argparse

    HelpFormatter, RawDescriptionHelpFormatter = formatters()
    parser = argparse.ArgumentParser(
        prog="mpdoctor", description=MAIN_HELP, epilog=EXIT_CODES,
        formatter_class=RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mpdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, summary) in COMMANDS.items():
        if only is None or only == name:
            module = load(name)
            p = sub.add_parser(name, help=summary, description=module.DESCRIPTION, epilog=module.EPILOG,
                               formatter_class=RawDescriptionHelpFormatter)
            module.add_arguments(p)
            p.set_defaults(_main=module.main)
        else:
            sub.add_parser(name, help=summary, formatter_class=HelpFormatter)
    return parser


def fast_explain_args(argv: list[str]) -> Any:
    """The arguments of the most common call, `mpdoctor explain PATH` with any of
    `--format F`, `--format=F`, `--anonymize`, `-v`/`--verbose`, `--here`, read without
    argparse (its import and the parser cost a few ms of explain's start); the same
    values argparse gives (tests/test_cli_fast.py holds them equal). None for anything
    else (help, other options, abbreviations, errors): argparse reads it."""
    if not argv or argv[0] != "explain":
        return None
    path = None
    values: dict[str, Any] = {"format": "terminal", "anonymize": False, "verbose": False, "here": False}
    flags = {"--anonymize": "anonymize", "-v": "verbose", "--verbose": "verbose", "--here": "here"}
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in flags:
            values[flags[arg]] = True
        elif arg == "--format" and i + 1 < len(argv) and argv[i + 1] in OUTPUT_FORMATS:
            values["format"] = argv[i + 1]
            i += 1
        elif arg.startswith("--format=") and arg[9:] in OUTPUT_FORMATS:
            values["format"] = arg[9:]
        elif path is None and (arg == "-" or (arg and not arg.startswith("-"))):
            path = arg
        else:
            return None
        i += 1
    if path is None:
        return None
    from types import SimpleNamespace

    from .commands.explain import main as explain_main

    return SimpleNamespace(command="explain", path=path, rules=[], snapshot=None, _main=explain_main, **values)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    fast = fast_explain_args(argv)
    if fast is not None:
        return guarded(fast._main, fast)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args: Any = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return guarded(args._main, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
