"""`mpdoctor probe`: train a small model in every precision mode and compare."""

from __future__ import annotations

import sys
from argparse import Namespace
from typing import Any

from . import env_help, fail

DESCRIPTION = (
    "Train a model (a small built-in one, or yours: --model SPEC) through\n"
    "accelerate in each precision mode and report what works, how fast, how much\n"
    "memory, how far from fp32, and which to use.\n\n"
    "  mpdoctor probe\n  mpdoctor probe --modes no,bf16 --steps 30 --model mlp\n"
    "  mpdoctor probe --stress --format json   # fp16 headroom vs bf16\n"
    "  mpdoctor probe --model path/to/config.json --modes no,bf16 --max-batch\n"
    "  mpdoctor probe --model ./my-model   # a save_pretrained folder\n"
    "  mpdoctor probe --model mypkg.models:make_model --batch-size 32\n\n"
    "Each mode runs in its own process with a timeout; the timed steps come\n"
    "in rounds, one mode after the other, until the speed-ups are stable (or\n"
    "are said to be unreliable, with the range they fell in). A mode that fails is\n"
    "reported with its error explained by the rule base. A mode that did not\n"
    "really run (e.g. accelerate's fp16 on a CPU runs fp32) is flagged and gets no\n"
    "speed-up or memory saving."
)
EPILOG = ("exit status:\n  0  at least one mode trained\n  1  no mode trained\n  2  the arguments are wrong, or torch/accelerate are\n"
          "     missing where the modes would run (see --python)\n  130  interrupted (Ctrl-C)\n" + env_help("MPDOCTOR_RULES_PATH", "MPDOCTOR_SAVE_PROBE", "MPDOCTOR_PROBE_FAULT",
                                                  "MPDOCTOR_PROBE_MEMORY_LIMIT",
                                                  "MPDOCTOR_DEBUG", "NO_COLOR"))
EXIT_OK, EXIT_NO_MODE_WORKS, EXIT_CANNOT_PROBE = 0, 1, 2


def add_arguments(p: Any) -> None:
    from . import add_output_options

    add_output_options(p, formats=("terminal", "json", "markdown"))
    p.add_argument("--modes", default="no,fp16,bf16,fp8", help="comma-separated modes out of no, fp16, bf16, fp8 (default: all four)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per mode, exactly (default: 20, 5 of them warm-up, then more, "
                        "timed in rounds with the other modes, until the speed-ups are stable, up to 60; "
                        "8, 3 and 24 with your own --model)")
    p.add_argument("--model", default="transformer", metavar="SPEC",
                   help="the model: a built-in one (transformer (default), mlp, conv), your own as "
                        "package.module:factory or path/to/file.py[:factory] (a function returning the model, "
                        "(model, batch) or (model, batch, loss_fn)), a transformers config.json "
                        "(built from the config, randomly initialised, nothing downloaded), or a "
                        "save_pretrained folder (its config and weights, offline)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: 16 transformer, 64 mlp, 32 conv; 8 or the factory's batch for your model")
    p.add_argument("--seq-len", type=int, default=128, metavar="N",
                   help="sequence length of the batch made for your model when it takes token ids (default 128)")
    p.add_argument("--max-batch", type=int, nargs="?", const=4096, default=None, metavar="UPPER",
                   help="also find, per mode, the largest batch that trains without running out of memory "
                        "(doubling, then bisection, up to UPPER, default 4096)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="for --max-batch, cap each mode's process at SIZE of address space (e.g. 4G; "
                        "RLIMIT_AS): the batch that fits in that much memory (env MPDOCTOR_PROBE_MEMORY_LIMIT)")
    p.add_argument("--device", choices=("cpu", "cuda", "mps"), default=None,
                   help="default: cuda if available, else mps, else cpu")
    p.add_argument("--stress", action="store_true", help="scale activations towards the fp16 limit")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="kill a mode's child after this long (default 180)")
    p.add_argument("--python", metavar="PATH",
                   help="train with this interpreter's torch and accelerate (the environment that trains; "
                        "default: the one mpdoctor runs in)")


def options_from_args(args: Namespace) -> Any:
    import os

    from ..probe import ProbeOptions
    from ..probe.spec import parse_bytes, parse_model_spec

    modes = [m.strip() for m in str(args.modes).split(",") if m.strip()]
    spec = parse_model_spec(args.model)
    opts = ProbeOptions(modes=modes, model=spec["name"] if spec["kind"] == "builtin" else "user",
                        batch_size=args.batch_size, device=args.device,
                        stress=bool(args.stress), rules=list(getattr(args, "rules", []) or []),
                        model_spec=None if spec["kind"] == "builtin" else spec,
                        seq_len=getattr(args, "seq_len", 128), max_batch=getattr(args, "max_batch", None))
    limit = getattr(args, "memory_limit", None) or os.environ.get("MPDOCTOR_PROBE_MEMORY_LIMIT")
    if limit:
        try:
            opts.memory_limit = parse_bytes(limit)
        except ValueError as exc:
            raise ValueError(f"--memory-limit: {exc}") from None
    if opts.model_spec:
        # a real model's step costs far more than the toy's: fewer, still past the
        # warm-up, one step per mode and round, and longer for the rounds to settle
        opts.steps, opts.warmup, opts.round_steps, opts.round_budget_s = 8, 3, 1, 60.0
    if args.steps is not None:
        # asked for: exactly that many, the timed ones one per mode and round
        opts.steps = opts.max_steps = args.steps
        opts.round_steps = 1
    if getattr(args, "timeout", None) is not None:
        opts.timeout_s = float(args.timeout)
    opts.validate()
    return opts


def _torch_problem(args: Namespace, opts: Any) -> int | None:
    """The exit status when the probe cannot train at all: --python unusable, or torch
    / accelerate missing where the modes would run (a core install). None: go on."""
    from ..env.child import missing_modules, python_problem, torch_missing_message
    from ..env.torch_collector import same_python

    python = getattr(args, "python", None)
    if python:
        problem = python_problem(python)
        if problem:
            return fail(problem)
    missing = missing_modules(python)
    if missing:
        # nothing can be judged here: the README's 2 (as check without torch), not "no mode trained"
        sys.stderr.write("mpdoctor: " + torch_missing_message(python, missing) + "\n")
        return EXIT_CANNOT_PROBE
    if python:
        if hasattr(opts, "python"):
            opts.python = python
        elif not same_python(python):
            return fail(f"--python {python}: this probe runs its modes in mpdoctor's own interpreter only; "
                        f"install mpdoctor there and run `{python} -m mpdoctor probe`")
    return None


def main(args: Namespace) -> int:
    from ..diagnosis.probe import run_probe_with_progress
    from ..engine.rule import RuleError
    from ..probe import print_terminal, to_markdown
    from ..rulebase import load

    try:
        opts = options_from_args(args)
        load(opts.rules)  # a bad rules folder is the user's error, said before any run
    except (ValueError, RuleError) as exc:
        return fail(str(exc))
    missing_torch = _torch_problem(args, opts)
    if missing_torch is not None:
        return missing_torch
    from ..probe import Interrupted, ModelSpecFailed

    try:
        report = run_probe_with_progress(opts)
    except ModelSpecFailed as exc:
        return fail(str(exc))
    except Interrupted as exc:
        return exc.die()
    from ..redact import Scrubber
    from ..render import SCHEMAS, make_console

    scrub = Scrubber(getattr(args, "anonymize", False))
    if args.format == "json":
        import json

        data = {"schema": SCHEMAS["probe"], **scrub.obj(report.to_dict(), by_name=False)}
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    elif args.format == "markdown":
        from ..redact import markdown_safe

        sys.stdout.write(markdown_safe(scrub.text(to_markdown(report))))
    else:
        print_terminal(report, make_console(anonymize=scrub.anonymize))
    sys.stdout.flush()
    return EXIT_OK if report.any_mode_works else EXIT_NO_MODE_WORKS
