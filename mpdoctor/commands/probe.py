"""`mpdoctor probe`: train a small model in every precision mode and compare."""

from __future__ import annotations

import sys
from argparse import Namespace
from typing import Any

from . import fail

DESCRIPTION = (
    "Train a small built-in model through accelerate in each precision mode and report\n"
    "what works, how fast, how much memory, how far from fp32, and which to use.\n\n"
    "  mpdoctor probe\n  mpdoctor probe --modes no,bf16 --steps 30 --model mlp\n"
    "  mpdoctor probe --stress --format json   # fp16 headroom vs bf16\n\n"
    "Each mode runs in its own process with a timeout; a mode that fails is reported with\n"
    "its error explained by the rule base. A mode that did not really run (e.g. accelerate's\n"
    "fp16 on a CPU runs fp32) is flagged and gets no speed-up or memory saving."
)
EPILOG = "exit status:\n  0  at least one mode trained\n  1  no mode trained\n  2  the arguments are wrong\n"
EXIT_OK, EXIT_NO_MODE_WORKS = 0, 1


def add_arguments(p: Any) -> None:
    from ..cli import add_output_options

    add_output_options(p)
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


def options_from_args(args: Namespace) -> Any:
    from ..probe import ProbeOptions

    modes = [m.strip() for m in str(args.modes).split(",") if m.strip()]
    opts = ProbeOptions(modes=modes, model=args.model, batch_size=args.batch_size, device=args.device,
                        stress=bool(args.stress), rules=list(getattr(args, "rules", []) or []))
    if args.steps is not None:
        opts.steps = args.steps
    if getattr(args, "timeout", None) is not None:
        opts.timeout_s = float(args.timeout)
    opts.validate()
    return opts


def main(args: Namespace) -> int:
    from ..engine.rule import RuleError
    from ..rulebase import load
    from ..probe import print_terminal, run_probe_with_progress, to_markdown

    try:
        opts = options_from_args(args)
        load(opts.rules)  # a bad rules folder is the user's error, said before any run
    except (ValueError, RuleError) as exc:
        return fail(str(exc))
    report = run_probe_with_progress(opts)
    if args.format == "json":
        sys.stdout.write(report.to_json())
    elif args.format == "markdown":
        sys.stdout.write(to_markdown(report))
    else:
        from ..render import make_console

        print_terminal(report, make_console())
    sys.stdout.flush()
    return EXIT_OK if report.any_mode_works else EXIT_NO_MODE_WORKS
