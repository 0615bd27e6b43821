"""`mpdoctor check` and `mpdoctor collect`: a few lines each over mpdoctor.env.

check: collect this machine (torch examined in a child process) or read --snapshot,
judge it with the environment rules, print the checklist. Exit status as for explain:
0 no error finding, 1 at least one, 2 bad input (unreadable snapshot, missing
--config-file, a broken rule).

`--probe` hands the snapshot to the probe face: `mpdoctor.probe.run_probe_for_check(
snapshot)` returns a dict; its "findings" (list of Finding) join the report and its
"lines" (list of str) are printed under "Probe"; the whole dict is in the JSON as
"probe".
"""

from __future__ import annotations

import json
import os
import sys
from argparse import Namespace
from typing import Any

from .commands import EXIT_ERROR_FINDING, EXIT_OK, fail, load_or_fail
from .findings import has_error, rank_findings


def _config_file_problem(path: str | None) -> str | None:
    if path and not os.path.isfile(os.path.expanduser(path)):
        return f"--config-file {path}: no such file"
    return None


def _attach_probe(report: Any, snapshot: dict[str, Any]) -> None:
    try:
        from .probe import run_probe_for_check
    except ImportError as exc:
        report.extra["probe"] = {"error": f"the probe is not available in this build ({exc})"}
        return
    result = run_probe_for_check(snapshot) or {}
    # the probe's findings join the report's own list; the rest is the probe's table
    report.findings = rank_findings(report.findings + list(result.get("findings", [])))
    report.extra["probe"] = {k: v for k, v in result.items() if k != "findings"}


def check_main(args: Namespace) -> int:
    from .env import SnapshotError, load_snapshot, start_collection

    problem = _config_file_problem(args.config_file)
    if problem:
        return fail(problem)
    # torch imports in the child while this process loads the rules
    pending = None if args.snapshot else start_collection(config_file=args.config_file)
    from .env.judge import EnvRuleError, judge

    rules = load_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    if args.snapshot:
        try:
            snapshot = load_snapshot(args.snapshot)
        except SnapshotError as exc:
            return fail(str(exc))
        if args.config_file:  # judge the recorded machine with this config
            from .env.accel_config import collect_accelerate_config
            from .env.redact import redact_snapshot

            snapshot["accelerate_config"] = redact_snapshot(
                {"accelerate_config": collect_accelerate_config(args.config_file, env=snapshot["env"])}
            )["accelerate_config"]
        source = args.snapshot
    else:
        snapshot = pending.finish()
        source = "live"
    try:
        report = judge(snapshot, mixed_precision=args.mixed_precision, rules=rules, source=source)
    except EnvRuleError as exc:
        return fail(f"bad rule: {exc}")
    if getattr(args, "probe", False):
        _attach_probe(report, snapshot)
    heading = "mpdoctor check" + (f" --snapshot {args.snapshot}" if args.snapshot else " (this machine)")
    from .render import make_console, print_checklist, to_checklist_markdown, to_json

    if args.format == "json":
        sys.stdout.write(to_json(report))
    elif args.format == "markdown":
        sys.stdout.write(to_checklist_markdown(report, heading))
    else:
        print_checklist(report, make_console(), heading)
    sys.stdout.flush()
    return EXIT_ERROR_FINDING if has_error(report.findings) else EXIT_OK


def collect_main(args: Namespace) -> int:
    from .env import collect

    problem = _config_file_problem(args.config_file)
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
