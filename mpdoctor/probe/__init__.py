"""`mpdoctor probe`: a live, instrumented accelerate run of every precision mode.

Rooms: `runner` (parent: one child per mode, with a deadline), `child` (the training
run itself, the only side that imports torch, with `models` and `observe`),
`analysis` (rows, findings, recommendation), `report` (json / markdown / table).
Importing this package does not import torch.
"""

from __future__ import annotations

import sys
from typing import Any

from .recommend import recommend
from .report import ProbeReport, _footer_lines, print_terminal, table_rows, to_markdown, to_text_lines
from .rows import build_rows
from .runner import MODES, Interrupted, ModelSpecFailed, ProbeOptions, Progress, run_modes

__all__ = ["MODES", "Interrupted", "ModelSpecFailed", "ProbeOptions", "ProbeReport", "print_terminal", "run_probe",
           "run_probe_for_check", "run_probe_with_progress", "to_markdown"]


def run_probe(opts: ProbeOptions, progress: Progress | None, judge: Any) -> ProbeReport:
    """Every mode run; `judge` (diagnosis.probe.ModeJudge, with the rule base) judges each."""
    outcomes, meta = run_modes(opts, progress)
    rows = build_rows(outcomes, opts, judge)
    base = next((o.result for o in outcomes if o.mode == "no" and o.result), None)
    first = base or next((o.result for o in outcomes if o.result), None) or {}
    options = {"modes": list(opts.modes), "steps": opts.steps, "warmup": opts.warmup_steps,
               "max_steps": opts.max_steps, "round_steps": opts.round_steps, "rounds": meta.get("rounds"),
               "rounds_stable": meta.get("stable"), "rounds_s": meta.get("rounds_s"),
               "model": opts.model_name, "batch_size": opts.batch_size, "device": opts.device,
               "stress": opts.stress, "timeout_s": opts.timeout_s, "seed": opts.seed,
               "accelerate": first.get("accelerate"), "seq_len": opts.seq_len if opts.model_spec else None,
               "max_batch": opts.max_batch, "memory_limit": opts.memory_limit}
    device = first.get("device", {})
    return ProbeReport(rows=rows, recommendation=recommend(rows, device.get("type")), device=device,
                       workload=first.get("workload", {}), overhead=(base or {}).get("overhead"),
                       options=options, wall_s=meta["wall_s"])


def run_probe_for_check(snapshot: dict[str, Any] | None, opts: ProbeOptions | None, judge: Any, *,
                        progress: bool = True) -> dict[str, Any]:
    """For `mpdoctor check --probe` (the contract in mpdoctor/check.py): the default
    probe of this machine as a dict, the probe's JSON plus "findings" (Finding objects,
    to join check's report) and "lines" (the table as plain text, printed under
    "Probe"). A snapshot whose torch does not import is not probed: every child would
    fail the same way check already reports."""
    torch_status = ((snapshot or {}).get("torch") or {}).get("status", "ok")
    if torch_status != "ok":
        return {"findings": [], "lines": [f"not run: torch does not import here ({torch_status}); "
                                          "see the findings above"], "ran": False}
    elsewhere = _other_machine(snapshot)
    if elsewhere:
        return {"findings": [], "lines": [f"not run: the snapshot is from another machine ({elsewhere}); "
                                          "the probe measures only the machine it runs on"], "ran": False}
    try:
        report = run_probe_with_progress(opts or ProbeOptions(), judge, progress=progress)
    except Interrupted as exc:
        exc.die()
        raise
    out = report.to_dict()
    out["findings"] = report.findings
    out["lines"] = to_text_lines(report)
    cols, body = table_rows(report)  # for check's renderer (one table layout for every face)
    out["table"], out["footer"] = {"columns": cols, "rows": body}, _footer_lines(report)
    out["ran"] = True
    return out


def _other_machine(snapshot: dict[str, Any] | None) -> str | None:
    """A recorded snapshot's CPU, when it is not this machine's (a --snapshot from
    elsewhere): probing here would answer a question nobody asked."""
    import os

    cpu = (snapshot or {}).get("cpu") or {}
    model, cores = cpu.get("model"), cpu.get("logical_cores")
    if not model:
        return None
    here = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    here = line.split(":", 1)[1].strip()
                    break
    except OSError:
        return None  # cannot tell: probe
    if here is None:
        return None
    if here != model or (cores and cores != os.cpu_count()):
        return f"{model}, {cores} logical cores"
    return None


def run_probe_with_progress(opts: ProbeOptions, judge: Any, *, progress: bool = True) -> ProbeReport:
    """run_probe with the rich progress bar on stderr, only when it is a terminal."""
    bar = _ProgressBar(opts) if progress and sys.stderr.isatty() else None
    try:
        return run_probe(opts, bar.update if bar else None, judge)
    finally:
        if bar:
            bar.close()


class _ProgressBar:
    """One line per mode on stderr, only on a terminal: the children start together and
    are timed in turn, so every mode's phase and steps show at once."""

    def __init__(self, opts: ProbeOptions) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = opts.steps
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self.tasks: dict[str, Any] = {}
        self.progress.start()

    def update(self, mode: str, event: dict[str, Any]) -> None:
        kind = event.get("event")
        task = self.tasks.get(mode)
        if task is None:
            task = self.tasks[mode] = self.progress.add_task(f"mode {mode}: starting", total=self.total)
        if kind == "phase":
            self.progress.update(task, description=f"mode {mode}: {event.get('name')}")
        elif kind == "step":
            step = int(event.get("step", 0))
            self.progress.update(task, completed=step, total=max(self.total, step))
        elif kind == "end":
            self.progress.update(task, description=f"mode {mode}: {'done' if event.get('ok') else 'failed'}")

    def close(self) -> None:
        self.progress.stop()
