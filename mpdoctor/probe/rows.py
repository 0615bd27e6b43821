"""From the children's measurements to one row per mode, with its findings.

Pure Python over the children's JSON (no torch). The rules of honesty live here: a
mode whose first matmul did not run in the requested dtype gets no speed-up and no
memory saving (it did not happen). What the rows say about a mode comes from the rule
base (diagnosis.probe, handed in): a failed mode's stderr as `explain` reads it, a mode that trained
through the probe, run and env rules.
"""

from __future__ import annotations

import math
import signal
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..findings import Finding
from ..knowledge.signals import signal_name
from .evidence import EXPECTED_DTYPE, probe_evidence
from .runner import ChildOutcome, ProbeOptions
from .stability import MIN_SPEEDUP, RELIABLE, SPEED_THRESHOLDS, figure, median_interval, round_ratios

__all__ = ["MIN_SPEEDUP", "ModeRow", "build_rows"]

BF16_MAX = 3.3895313892515355e38
# Below these a difference is within what two identical fp32 runs differ by here.
MIN_MEMORY_SAVING = 0.10
MAX_LOSS_REL_DIFF = 0.02
# Other processes' share of the CPUs during a mode's timing above which the report
# says so (and, for timings not made in paired rounds, calls them unreliable).
BUSY_SHARE = 0.15
# Timings not made in rounds (an older result): a mode whose step times' interquartile
# range exceeds this share of their median was timed in noise, not in its precision.
MAX_SPREAD = 0.5


@dataclass
class ModeRow:
    mode: str
    ok: bool
    baseline_only: bool = False
    steps: int | None = None
    ran_as_requested: bool | None = None
    step_time_s: float | None = None
    step_time_spread: float | None = None
    step_time_reliable: bool | None = None
    speedup: float | None = None
    # the speed-up's interval over the timed rounds (probe/stability.py) and whether it
    # can be trusted; an unreliable speed-up is shown as its interval, never as a number
    speedup_low: float | None = None
    speedup_high: float | None = None
    speedup_reliable: bool | None = None
    rounds: int | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None
    memory_saving: float | None = None
    final_loss: float | None = None
    loss_rel_diff: float | None = None
    logits_rel_diff: float | None = None
    autocast_dtype: str | None = None
    skipped_steps: int | None = None
    final_scale: float | None = None
    nonfinite_count: int = 0
    peak_activation: float | None = None
    max_rss_bytes: int | None = None
    # headroom: the modules closest to their dtype's largest value (probe/headroom.py)
    headroom: list[dict[str, Any]] = field(default_factory=list)
    fp16_headroom: list[dict[str, Any]] = field(default_factory=list)
    first_nonfinite_module: dict[str, Any] | None = None
    max_batch: int | None = None
    max_batch_search: dict[str, Any] | None = None
    cpu_used_by_others: float | None = None
    error: str | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    note: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {k: _json_number(v) for k, v in self.__dict__.items() if k != "findings"}
        out["findings"] = [f.to_dict() for f in self.findings]
        return out


def _json_number(v: Any) -> Any:
    # JSON has no inf/nan: a non-finite measurement is null (its count says why).
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _spread(times: list[float]) -> float | None:
    if len(times) < 4:
        return None
    q = statistics.quantiles(times, n=4)
    med = statistics.median(times)
    return (q[2] - q[0]) / med if med > 0 else None


def _max_rel_diff(a: list[float] | None, ref: list[float] | None) -> float | None:
    """Largest absolute difference over the largest reference magnitude: elementwise
    relative differences blow up at logits near zero and would say nothing."""
    if not a or not ref or len(a) != len(ref):
        return None
    scale = max(abs(x) for x in ref)
    if not math.isfinite(scale) or scale == 0:
        return None
    worst = 0.0
    for x, y in zip(a, ref):
        d = abs(x - y)
        if not math.isfinite(d):  # an overflowed logit: no finite difference to report
            return math.inf
        if d > worst:
            worst = d
    return worst / scale


def _death(out: ChildOutcome, opts: ProbeOptions) -> str:
    where = f"during {out.last_phase}" if out.last_phase else "before it started"
    if out.last_phase == "train":
        where += f" (after step {out.last_step} of {opts.steps})"
    if out.timed_out:
        return f"timed out after {opts.child_timeout_s:g} s {where}; the child was killed"
    rc = out.returncode
    if rc is not None and rc < 0:
        name = signal_name(-rc)
        extra = " (with no traceback: often the kernel's OOM killer)" if -rc == signal.SIGKILL else ""
        return f"killed by {name} {where}{extra}"
    last = _last_exception_line(out.stderr_tail)
    return last or f"exited with status {rc} {where}"


def _last_exception_line(text: str) -> str | None:
    import re

    # The last line that looks like `SomeError: message` at the start of a line.
    found = None
    for line in text.splitlines():
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*", line):
            found = line.strip()
    return found


def build_rows(outcomes: list[ChildOutcome], opts: ProbeOptions, judge: Any) -> list[ModeRow]:
    """One row per mode. `judge` (diagnosis.probe.ModeJudge) judges each mode with the
    rule base: `failed(mode, stderr)`, `mode(evidence, stderr)`, `save(evidence)`."""
    base = next((o for o in outcomes if o.mode == "no"), None)
    base_res = base.result if base else None
    options = {"stress": opts.stress, "model": opts.model_name, "device": opts.device, "steps": opts.steps}
    rows = []
    for out in outcomes:
        row = ModeRow(mode=out.mode, ok=out.result is not None, baseline_only=out.baseline_only,
                      timed_out=out.timed_out, wall_s=round(out.wall_s, 2))
        if out.result is None:
            row.error = _death(out, opts)
            row.findings, unknown = judge.failed(out.mode, out.stderr_tail)
            if not row.findings and unknown:
                row.note = f"not recognised by the rule base: {unknown[-1]}"
        else:
            _fill_measured(row, out.result, base_res, opts)
            evidence = probe_evidence(out.mode, out.result, base_res if out.mode != "no" else None, options)
            judge.save(evidence)
            row.findings = judge.mode(evidence, out.stderr_tail)
        rows.append(row)
    return rows


def _fill_measured(row: ModeRow, res: dict[str, Any], base: dict[str, Any] | None, opts: ProbeOptions) -> None:
    obs = res.get("observed", {})
    row.autocast_dtype = res.get("autocast_dtype")
    row.steps = res.get("steps")
    if row.mode == "fp8":
        row.ran_as_requested = res.get("fp8_modules", 0) > 0
    else:
        row.ran_as_requested = row.autocast_dtype == EXPECTED_DTYPE[row.mode]
    rounds = [min(t) for t in (res.get("round_times_s") or []) if t]
    if rounds:
        row.rounds = len(rounds)
        row.step_time_s = statistics.median(rounds)
        ci = median_interval(rounds)
        row.step_time_spread = (ci[1] - ci[0]) / row.step_time_s if ci and row.step_time_s else None
        row.step_time_reliable = ci is not None and ci[1] / ci[0] <= RELIABLE
    else:
        times = res.get("step_times_s", [])[res.get("warmup", 0):]
        row.step_time_s = res.get("step_time_s")
        row.step_time_spread = _spread(times)
        row.step_time_reliable = row.step_time_spread is not None and row.step_time_spread <= MAX_SPREAD
    row.peak_memory_bytes = res.get("peak_memory_bytes")
    row.memory_kind = res.get("memory_kind")
    row.final_loss = res.get("final_loss")
    row.skipped_steps = obs.get("skipped_steps", 0)
    row.final_scale = obs.get("scaler", {}).get("final_scale")
    # Steps whose loss was non-finite, plus the fixed batch if its logits were; a module
    # watch() saw go non-finite while the loss stayed finite still counts once.
    row.nonfinite_count = int(obs.get("nonfinite_count", 0)) + int(res["eval"].get("nonfinite_logits", 0) > 0)
    if not row.nonfinite_count and obs.get("module_nonfinite"):
        row.nonfinite_count = 1
    row.peak_activation = res["eval"].get("peak_abs")
    row.cpu_used_by_others = res.get("cpu_used_by_others")
    row.max_rss_bytes = res.get("max_rss_bytes")
    room = res.get("headroom") or {}
    row.headroom = list(room.get("closest") or [])[:3]
    row.fp16_headroom = list(room.get("closest_fp16") or [])[:3]
    row.first_nonfinite_module = room.get("first_nonfinite")
    mb = res.get("max_batch")
    if mb:
        row.max_batch = mb.get("batch")
        row.max_batch_search = {k: v for k, v in mb.items() if k != "tries"} | {"tries": len(mb.get("tries") or [])}
    if base is None:
        return
    real = row.ran_as_requested or row.mode == "no"
    base_rounds = [min(t) for t in (base.get("round_times_s") or []) if t]
    if real and row.mode == "no":
        row.speedup, row.speedup_reliable = 1.0, (True if rounds else None)
    elif real and rounds and base_rounds:
        # paired round by round: both timed within moments of each other
        fig = figure(round_ratios(base_rounds, rounds), SPEED_THRESHOLDS)
        row.speedup, row.speedup_low, row.speedup_high = fig.value, fig.low, fig.high
        row.speedup_reliable = fig.reliable
    elif real and row.step_time_s and base.get("step_time_s"):
        row.speedup = base["step_time_s"] / row.step_time_s
        row.speedup_reliable = None  # not made in rounds: judged by its spread and the CPU's load
    if (real and row.peak_memory_bytes and base.get("peak_memory_bytes")
            and res.get("memory_kind") == base.get("memory_kind")):
        row.memory_saving = 1.0 - row.peak_memory_bytes / base["peak_memory_bytes"]
    if not real:
        row.note = (f"{row.mode} did not run: the first matmul produced {row.autocast_dtype}, "
                    "so no speed-up or memory saving is claimed")
    mine, ref = res.get("losses") or [], base.get("losses") or []
    if mine and ref and len(mine) != len(ref):
        # a mode cut short (fp16 that ran fp32 on a CPU): compared at its last step
        k = min(len(mine), len(ref)) - 1
        if ref[k]:
            row.loss_rel_diff = abs(mine[k] - ref[k]) / abs(ref[k])
    elif row.final_loss is not None and base.get("final_loss"):
        row.loss_rel_diff = abs(row.final_loss - base["final_loss"]) / abs(base["final_loss"])
    row.logits_rel_diff = _max_rel_diff(res["eval"].get("logits"), base["eval"].get("logits"))
