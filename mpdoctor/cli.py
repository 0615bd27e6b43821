"""Argument parsing only: each face is a module of mpdoctor.commands."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    import argparse
    from typing import Any, Sequence

from . import __version__
from .commands import COMMANDS, EXIT_CODES, OUTPUT_FORMATS, guarded, load

MAIN_HELP = """\
mpdoctor diagnoses mixed-precision (fp16 / bf16 / fp8) training problems with
PyTorch and Hugging Face accelerate: it names the root cause, explains it with
the evidence from your own log and machine, and says what to change.

examples:
  mpdoctor explain train.log          # a traceback or a log -> cause + fix
  python train.py 2>&1 | mpdoctor explain -
  mpdoctor check                      # is this machine ready for fp16/bf16?
  mpdoctor check --mixed-precision bf16
  mpdoctor collect -o env.json        # snapshot the environment ...
  mpdoctor check --snapshot env.json  # ... and judge it anywhere
  mpdoctor run -- python train.py     # wrap a failing run, diagnose it live
  mpdoctor probe                      # measure no/fp16/bf16/fp8 here
  mpdoctor rules list                 # the knowledge base; `rules show ID`

`mpdoctor` alone lists the commands on standard output and exits 0 (as pip
does); a wrong option names itself in its command's usage, exit status 2.
"""


def _terminal_columns() -> int:
    """`shutil.get_terminal_size().columns`, as argparse asks it for every parser and
    argument, without importing shutil (with bz2, lzma, zlib: a few ms of the start);
    80 for COLUMNS=0, a negative or garbled value, or a terminal that says 0."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


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
            def _fill_text(self, text: str, width: int, indent: str) -> str:
                # the descriptions and epilogs keep their lines, but none wider than the
                # terminal (argparse's width is 2 less): a longer one breaks at spaces,
                # under its own indent
                from .render import cells, wrap

                out: list[str] = []
                width = max(width + 2, 20)
                for line in text.splitlines():
                    body = line.lstrip(" ")
                    if cells(indent + line) <= width or not body:
                        out.append(indent + line)
                    else:
                        out += wrap(body, width, indent=len(indent) + len(line) - len(body))
                return "\n".join(out) + ("\n" if text.endswith("\n") else "")

        _FORMATTERS = (HelpFormatter, RawDescriptionHelpFormatter)
    return _FORMATTERS


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

    return SimpleNamespace(command="explain", path=[path], rules=[], snapshot=None, _main=explain_main, **values)


def short_usage() -> str:
    """What bare `mpdoctor` prints (pip's convention: the commands, on stdout, exit 0)."""
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: mpdoctor COMMAND [OPTIONS]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_module, summary) in COMMANDS.items()]
    lines += ["", "`mpdoctor COMMAND --help` for a command's options and examples,",
              "`mpdoctor --help` for the whole picture."]
    return "\n".join(lines) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _looks_positional(token: str) -> bool:
    # `-` is standard input; `-1` and `-.5` are numbers (argparse reads them as values)
    return token == "-" or not token.startswith("-") or token[1:].replace(".", "", 1).isdigit()


def unknown_option(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.ArgumentParser, str] | None:
    """(the parser of the command it was given to, the option) for the first option no
    parser on the way knows: `mpdoctor explain --frmat json x` is explain's error about
    `--frmat`, not the top level's about `json` and `x`. After `--`, and after `run`'s
    command starts, every word is the command's."""
    current, i = parser, 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":
            return None
        if _looks_positional(token):
            subs = _subcommands(current)
            if token in subs:
                current = subs[token]
            elif current.prog.endswith(" run"):
                return None  # the wrapped command's own words
            continue
        name = token.split("=", 1)[0]
        actions = current._option_string_actions
        known = [o for o in actions if o == name] or [o for o in actions if name.startswith("--") and o.startswith(name)]
        if not known and not name.startswith("--") and name[:2] in actions:
            if actions[name[:2]].nargs is None:  # -oFILE: a short option and its value
                continue
            if all(f"-{c}" in actions and actions[f"-{c}"].nargs == 0 for c in name[1:]):  # -vh
                continue
        if not known:
            return current, token
        action = actions[known[0]]
        if "=" not in token and action.nargs is None and i < len(argv):
            i += 1  # its value, whatever it looks like
    return None


def _option_error(parser: argparse.ArgumentParser, token: str) -> None:
    import difflib

    name = token.split("=", 1)[0]
    longs = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(name, longs, n=1, cutoff=0.75)
    hint = f"; did you mean '{close[0]}'?" if close else f"; see `{parser.prog} --help`"
    parser.error(f"unrecognized option '{name}'{hint}")


def _chosen_parser(parser: argparse.ArgumentParser, args: Any) -> argparse.ArgumentParser:
    """The parser of the (sub)command the arguments chose: the one whose usage fits."""
    import argparse

    while True:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
                parser = action.choices[getattr(args, action.dest)]
                break
        else:
            return parser


def _replace_unencodable() -> None:
    """A stdout that cannot encode every character (LC_ALL=C without UTF-8, a Latin-1
    locale, PYTHONIOENCODING=latin-1) shows `?` for what it cannot encode, instead of
    mpdoctor stopping on a UnicodeEncodeError."""
    stream = sys.stdout
    try:
        if stream is not None and stream.errors in ("strict", "surrogateescape") and \
                stream.encoding.lower().replace("-", "").replace("_", "") != "utf8":
            stream.reconfigure(errors="replace")
    except (AttributeError, ValueError, LookupError):  # not a TextIOWrapper (a test's capture)
        pass


def _stdout_needed(args: Any) -> bool:
    """Whether the command's report goes to standard output (run reports on stderr;
    collect -o writes a file)."""
    command = getattr(args, "command", None)
    return not (command == "run" or (command == "collect" and getattr(args, "output", None)))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _replace_unencodable()
    fast = fast_explain_args(argv)
    if fast is not None:
        return _start(fast)
    if not argv:
        if sys.stdout is not None:
            sys.stdout.write(short_usage())
        return 0
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    bad = unknown_option(parser, argv)
    if bad is not None:
        _option_error(*bad)
    args, extra = parser.parse_known_args(argv)
    if extra:
        _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        if sys.stderr is not None:
            sys.stderr.write(short_usage())
        return 2
    return _start(args)


def _start(args: Any) -> int:
    if sys.stdout is None and _stdout_needed(args):  # started with `>&-`
        from .commands import fail

        return fail("standard output is closed: there is nowhere to write the report")
    return guarded(args._main, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
