"""Argument parsing only: each subcommand is a few lines calling the core."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from . import __version__

EXIT_CODES = """\
exit status:
  0  no finding of severity error
  1  at least one error finding
  2  the input could not be read, or the arguments or rules are wrong
"""

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


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("terminal", "json", "markdown"), default="terminal",
                   help="terminal (default, rich), json (stable, for scripts), markdown (for a GitHub issue)")
    p.add_argument("--rules", action="append", default=[], metavar="DIR",
                   help="also load the rules in DIR (repeatable; MPDOCTOR_RULES_PATH works too)")


def _explain_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain", help="explain a traceback or a training log",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES,
        description=(
            "Read a traceback or a whole training log (any size; ANSI colours, progress bars,\n"
            "rank prefixes and rich boxes are fine) and report what went wrong, root cause first:\n"
            "the rule, its category, why it happens, what to change, and the exact log lines.\n\n"
            "  mpdoctor explain train.log\n"
            "  torchrun ... 2>&1 | mpdoctor explain -\n"
            "  mpdoctor explain crash.txt --format markdown   # paste into an issue\n"
            "  mpdoctor explain train.log --format json       # stable, for scripts\n\n"
            "Your own rules: --rules DIR or MPDOCTOR_RULES_PATH=DIR[:DIR...] (see `mpdoctor rules`).\n"
            "Colours follow the terminal; NO_COLOR=1 turns them off."
        ),
    )
    p.add_argument("path", metavar="PATH", help="the log file, or - for standard input")
    _add_output(p)
    p.add_argument("--snapshot", metavar="FILE",
                   help="an environment snapshot (mpdoctor collect) to sharpen the explanation")
    p.add_argument("--here", action="store_true",
                   help="collect this machine's environment and use it to sharpen the explanation")


def _rules_parser(sub: Any) -> None:
    p = sub.add_parser("rules", help="list, show and test the rule base",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="exit status:\n  0  done (rules test: every case passed)\n"
                              "  1  rules test: a case failed\n  2  a rule file is malformed, or the arguments are wrong\n",
                       description="The knowledge mpdoctor uses, as data under rules/.\n\n"
                                   "  mpdoctor rules list\n  mpdoctor rules show cuda-oom\n"
                                   "  mpdoctor rules test            # every rule's examples\n"
                                   "  mpdoctor rules test ./my-rules # your own rules folder")
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION")
    rl = rsub.add_parser("list", help="one line per rule")
    _add_output(rl)
    rl.add_argument("--category", help="only this category")
    rs = rsub.add_parser("show", help="a rule's documentation")
    rs.add_argument("rule_id", metavar="ID")
    _add_output(rs)
    rt = rsub.add_parser("test", help="run every rule's examples and near misses")
    rt.add_argument("dir", nargs="?", metavar="DIR", help="test only the rules in DIR (loaded with the built-ins)")
    _add_output(rt)


def _check_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check", help="judge this machine (or a snapshot) before training",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES,
        description=(
            "Check the hardware, driver, CUDA build, libraries and accelerate config against\n"
            "the precision you want to train in.\n\n"
            "  mpdoctor check\n  mpdoctor check --mixed-precision bf16\n"
            "  mpdoctor check --snapshot env.json   # a snapshot from another machine"
        ),
    )
    _add_output(p)
    p.add_argument("--snapshot", metavar="FILE", help="judge this snapshot instead of this machine")
    p.add_argument("--mixed-precision", choices=("no", "fp16", "bf16", "fp8"),
                   help="the precision to judge (default: the accelerate config, else all modes)")
    p.add_argument("--config-file", metavar="FILE", help="the accelerate config file to read")
    p.add_argument("--probe", action="store_true", help="append a live probe of each precision mode")


def _collect_parser(sub: Any) -> None:
    p = sub.add_parser("collect", help="save this machine's environment as a snapshot",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Write the environment (hardware, driver, torch, libraries, accelerate\n"
                                   "config) as versioned JSON, secrets redacted.\n\n"
                                   "  mpdoctor collect -o env.json\n  mpdoctor collect --anonymize")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--config-file", metavar="FILE", help="the accelerate config file to read")
    p.add_argument("--anonymize", action="store_true", help="also replace the user name and home in paths")


def _run_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="wrap a training command and diagnose it as it fails",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Run COMMAND with its terminal passed through untouched, watch torch/accelerate\n"
            "inside it (NaN/Inf, overflow, loss scale, OOM, dtype/device mismatches), and\n"
            "diagnose the failure. The exit status is the command's own.\n\n"
            "  mpdoctor run -- python train.py --lr 3e-4\n"
            "  mpdoctor run -- accelerate launch train.py\n"
            "  mpdoctor run --report report.json -- torchrun --nproc-per-node 2 train.py"
        ),
    )
    _add_output(p)
    p.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument("--no-probe", action="store_true", help="do not instrument the child, only read its output")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def _probe_parser(sub: Any) -> None:
    p = sub.add_parser(
        "probe", help="measure every precision mode on this machine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Train a small built-in model through accelerate in each precision mode and report\n"
            "what works, how fast, how much memory, how far from fp32, and which to use.\n\n"
            "  mpdoctor probe\n  mpdoctor probe --modes no,bf16 --steps 30 --model mlp\n"
            "  mpdoctor probe --stress --format json   # fp16 headroom vs bf16\n\n"
            "Each mode runs in its own process with a timeout; a mode that fails is reported with\n"
            "its error explained by the rule base. A mode that did not really run (e.g. accelerate's\n"
            "fp16 on a CPU runs fp32) is flagged and gets no speed-up or memory saving."
        ),
        epilog="exit status:\n  0  at least one mode trained\n  1  no mode trained\n  2  the arguments are wrong\n",
    )
    _add_output(p)
    p.add_argument("--modes", default="no,fp16,bf16,fp8", help="comma-separated modes (default: all)")
    p.add_argument("--steps", type=int, default=None, help="training steps per mode (default 20, 5 of them warm-up)")
    p.add_argument("--model", default="transformer", choices=("transformer", "mlp", "conv"),
                   help="built-in model (default: a tiny transformer)")
    p.add_argument("--batch-size", type=int, default=None, help="default: 16 transformer, 64 mlp, 32 conv")
    p.add_argument("--device", choices=("cpu", "cuda", "mps"), default=None,
                   help="default: cuda if available, else mps, else cpu")
    p.add_argument("--stress", action="store_true", help="scale activations towards the fp16 limit")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="kill a mode's child after this long (default 180)")


_FACES: dict[str, Callable[[Any], None]] = {
    "explain": _explain_parser,
    "rules": _rules_parser,
    "check": _check_parser,
    "collect": _collect_parser,
    "run": _run_parser,
    "probe": _probe_parser,
}


_HELP = {
    "explain": "explain a traceback or a training log",
    "rules": "list, show and test the rule base",
    "check": "judge this machine (or a snapshot) before training",
    "collect": "save this machine's environment as a snapshot",
    "run": "wrap a training command and diagnose it as it fails",
    "probe": "measure every precision mode on this machine",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only`, the other subcommands get just their name and help
    (building every option of every face costs start-up time that `explain` should not pay)."""
    parser = argparse.ArgumentParser(
        prog="mpdoctor", description=MAIN_HELP, epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mpdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add in _FACES.items():
        if only is None or only == name:
            add(sub)
        else:
            sub.add_parser(name, help=_HELP[name])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in _FACES else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "explain":
            from .commands import explain_main

            return explain_main(args)
        if args.command == "rules":
            from .commands import rules_main

            if args.rules_command is None:  # `mpdoctor rules` alone: its help, as an error
                import contextlib
                import io

                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    try:
                        parser.parse_args(["rules", "--help"])
                    except SystemExit:
                        pass
                sys.stderr.write(buf.getvalue())
                return 2
            return rules_main(args)
        if args.command == "check":
            from .check import check_main

            return check_main(args)
        if args.command == "collect":
            from .check import collect_main

            return collect_main(args)
        if args.command == "run":
            from .wrap import run_main

            return run_main(args)
        if args.command == "probe":
            from .probe import probe_main

            return probe_main(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
