"""`mpdoctor check`: collect this machine (torch examined in a child process) or read --snapshot,
judge it with the environment rules, print the checklist. Exit status as for explain:
0 no error finding, 1 at least one, 2 bad input (unreadable snapshot, missing
--config-file, a broken rule) or nothing to judge the precision with (torch not
importable in the interpreter examined, and no error finding: the checklist says
which areas were not judged and why, never a green ✓ over them).

`--probe` hands the snapshot to the probe face: `mpdoctor.probe.run_probe_for_check(
snapshot)` returns a dict; its "findings" (list of Finding) join the report and its
"lines" (list of str) are printed under "Probe"; the whole dict is in the JSON as
"probe".
"""

from __future__ import annotations

import os
from argparse import Namespace
from typing import Any

from ..findings import rank_findings
from . import EXIT_BAD_INPUT, EXIT_CODES, EXIT_ERROR_FINDING, EXIT_OK, env_help, fail, load_rules_or_fail

# The areas whose judgement needs torch's own answer (its build, its devices, its
# version against the libraries'): "not judged" when torch could not be examined.
TORCH_AREAS = ("torch", "precision", "arch", "libraries")

DESCRIPTION = (
    "Check the hardware, driver, CUDA build, libraries and accelerate config\n"
    "against the precision you want to train in.\n\n"
    "  mpdoctor check\n  mpdoctor check --mixed-precision bf16\n"
    "  mpdoctor check --python ~/venvs/train/bin/python  # the env that trains\n"
    "  mpdoctor check --snapshot env.json   # a snapshot from another machine\n\n"
    "torch is examined in a child process (its whole process group killed after\n"
    "MPDOCTOR_TORCH_TIMEOUT seconds, default 60), NVML in another: a torch or driver\n"
    "that hangs or crashes is reported, not fatal."
)
EPILOG = EXIT_CODES + (
    "  2 also when torch could not be examined (not importable in the interpreter\n"
    "     checked, and no error finding): the precision was not judged; point\n"
    "     --python at the interpreter that trains\n") + env_help("MPDOCTOR_TORCH_TIMEOUT", "MPDOCTOR_NVML_TIMEOUT", "MPDOCTOR_RULES_PATH",
                                "MPDOCTOR_CACHE_DIR",
                                "MPDOCTOR_NO_CACHE", "MPDOCTOR_DEBUG", "NO_COLOR")


def add_arguments(p: Any) -> None:
    from . import add_output_options

    add_output_options(p)
    p.add_argument("--snapshot", metavar="FILE", help="judge this snapshot instead of this machine")
    p.add_argument("--mixed-precision", choices=("no", "fp16", "bf16", "fp8"),
                   help="the precision to judge (default: the accelerate config, else all modes)")
    p.add_argument("--config-file", metavar="FILE", help="the accelerate config file to read")
    add_python_option(p)
    p.add_argument("--probe", action="store_true", help="append a live probe of each precision mode")


def add_python_option(p: Any) -> None:
    p.add_argument("--python", metavar="PATH",
                   help="examine the torch and libraries of this interpreter (the one that trains; "
                        "default: the one mpdoctor runs in). mpdoctor need not be installed there")


def python_option_problem(args: Namespace) -> str | None:
    python = getattr(args, "python", None)
    if not python:
        return None
    if getattr(args, "snapshot", None):
        return "--python examines a live interpreter; it cannot be combined with --snapshot"
    from ..env.child import python_problem

    return python_problem(python)


def config_file_problem(path: str | None) -> str | None:
    if path and not os.path.isfile(os.path.expanduser(path)):
        if os.path.exists(os.path.expanduser(path)):  # a folder, a FIFO, a device: never opened
            return f"--config-file {path}: not a regular file"
        return f"--config-file {path}: no such file"
    return None


def _attach_probe(report: Any, snapshot: dict[str, Any], rules: Any) -> None:
    try:
        from ..diagnosis.probe import run_probe_for_check
    except ImportError as exc:
        report.extra["probe"] = {"error": f"the probe is not available in this build ({exc})"}
        return
    result = run_probe_for_check(snapshot, rules=rules) or {}
    # the probe's findings join the report's own list; the rest is the probe's table
    report.findings = rank_findings(report.findings + list(result.get("findings", [])))
    report.extra["probe"] = {k: v for k, v in result.items() if k != "findings"}


def main(args: Namespace) -> int:
    from ..env import SnapshotError, load_snapshot, start_collection

    problem = config_file_problem(args.config_file) or python_option_problem(args)
    if problem:
        return fail(problem)
    # torch imports in the child while this process loads the rules
    pending = None if args.snapshot else start_collection(config_file=args.config_file,
                                                          python=getattr(args, "python", None))
    from ..env.judge import EnvRuleError, judge

    rules = load_rules_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    if args.snapshot:
        try:
            snapshot = load_snapshot(args.snapshot)
        except SnapshotError as exc:
            return fail(str(exc))
        if args.config_file:  # judge the recorded machine with this config
            from ..env.accel_config import collect_accelerate_config
            from ..env.redact import redact_snapshot

            snapshot["accelerate_config"] = redact_snapshot(
                {"accelerate_config": collect_accelerate_config(args.config_file, env=snapshot["env"])}
            )["accelerate_config"]
        source = args.snapshot
    else:
        try:
            snapshot = pending.finish()
        except SnapshotError as exc:  # what a collector child answered cannot be used
            return fail(f"this machine's environment could not be read: {exc}")
        source = "live"
    try:
        report = judge(snapshot, mixed_precision=args.mixed_precision, rules=rules, source=source)
    except EnvRuleError as exc:
        return fail(f"bad rule: {exc}")
    add_context(report, snapshot)
    unjudged = mark_not_judged(report, snapshot, live=not args.snapshot, python=getattr(args, "python", None))
    if getattr(args, "probe", False):
        _attach_probe(report, snapshot, rules)
    heading = "mpdoctor check" + (f" --snapshot {args.snapshot}" if args.snapshot else " (this machine)")
    from ..render import emit_checklist

    emit_checklist(report, args.format, heading, anonymize=getattr(args, "anonymize", False),
                   verbose=getattr(args, "verbose", False), where=args.snapshot or "check")
    if report.has_error:
        return EXIT_ERROR_FINDING
    return EXIT_BAD_INPUT if unjudged else EXIT_OK


def not_judged_reason(snapshot: dict[str, Any], *, live: bool, python: str | None) -> str | None:
    """Why torch's areas could not be judged (torch did not answer), or None."""
    torch = snapshot.get("torch") or {}
    status = torch.get("status")
    if status == "ok":
        return None
    where = python or torch.get("python")
    what = ("torch is not installed" if status == "not-installed" else
            f"torch could not be examined ({status})")
    if not live:
        return f"{what} on the recorded machine"
    if python:
        return f"{what} in {where} — point `--python` at the interpreter that trains"
    return f"{what} here ({where or 'this interpreter'}) — use `--python /path/to/train/python`"


def mark_not_judged(report: Any, snapshot: dict[str, Any], *, live: bool, python: str | None) -> str | None:
    """Torch did not answer: every torch area that shows nothing wrong is "not judged"
    (not ✓), and the checklist carries the reason for the summary line."""
    reason = not_judged_reason(snapshot, live=live, python=python)
    if not reason:
        return None
    c = report.extra.setdefault("checklist", {})
    for area in c.get("areas", []):
        if area.get("id") in TORCH_AREAS and area.get("status") in ("ok", "skipped"):
            area["status"] = "skipped"
            area["summary"] = "not judged: " + reason.split(" — ")[0]
    c["not_judged"] = reason
    report.extra["not_judged"] = reason
    return reason


def add_context(report: Any, snapshot: dict[str, Any]) -> None:
    """What `torch.utils.collect_env`, `accelerate env` and `transformers env` show and
    the checklist did not: OS and libc, numpy, the system CUDA toolkit, the thread
    settings, and the whole (redacted) accelerate config. In the JSON as
    "environment"; the checklist's environment lines gain the short form."""
    platform = snapshot.get("platform") or {}
    versions = (snapshot.get("packages") or {}).get("versions") or {}
    toolkit = snapshot.get("cuda_toolkit") or {}
    threads = snapshot.get("threads") or {}
    torch = snapshot.get("torch") or {}
    cfg = snapshot.get("accelerate_config") or {}
    env = {
        "os": platform.get("os"), "libc": platform.get("libc"), "kernel": platform.get("release"),
        "numpy": versions.get("numpy"),
        "cuda_toolkit": {k: toolkit.get(k) for k in ("cuda_home", "nvcc_version")} if toolkit else None,
        "threads": {**(threads.get("env") or {}), "torch.get_num_threads": torch.get("num_threads"),
                    "affinity_cores": threads.get("affinity_cores")} if (threads or torch.get("num_threads")) else None,
        "accelerate_config": {"path": cfg.get("path"), "config": cfg.get("config")} if cfg.get("config") else None,
    }
    report.extra["environment"] = env
    lines = report.extra.setdefault("checklist", {}).setdefault("environment", [])
    system = " · ".join(str(x) for x in (env["os"], env["libc"]) if x)
    if system:
        lines.append(f"OS: {system}")
    if versions and "error" not in (snapshot.get("packages") or {}):  # else nothing is known of any library
        lines.append("numpy " + (env["numpy"] or "not installed"))
    if toolkit:
        kit = toolkit.get("nvcc_version") or ("no nvcc" if toolkit.get("cuda_home") else None)
        lines.append("CUDA toolkit: " + (f"{kit} ({toolkit['cuda_home']})" if toolkit.get("cuda_home") else
                                         kit or "none found (no nvcc, no CUDA_HOME)"))
    if env["threads"]:
        t = env["threads"]
        parts = [f"{k}={t[k]}" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in t]
        if t.get("torch.get_num_threads") is not None:
            parts.append(f"torch.get_num_threads() {t['torch.get_num_threads']}")
        if t.get("affinity_cores") is not None:
            parts.append(f"{t['affinity_cores']} core(s) usable")
        lines.append("threads: " + (", ".join(parts) if parts else "no OMP/MKL setting"))
    config = (env["accelerate_config"] or {}).get("config")
    if isinstance(config, dict) and config:
        items = [f"{k}: {_short(v)}" for k, v in config.items()]
        lines.append("accelerate config: " + ", ".join(items))


def _short(value: Any) -> str:
    """A config value on one line: a nested section by its size (the JSON and the
    markdown carry it whole)."""
    if isinstance(value, dict):
        return f"{{{len(value)} setting(s)}}"
    if isinstance(value, list):
        return f"[{len(value)} item(s)]"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
