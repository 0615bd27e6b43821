"""The probe's recommendation: which mixed_precision to set on this machine, why, and
the line to write. Pure Python over the rows."""

from __future__ import annotations

from typing import Any

from .checks import MAX_SKIPPED_FRACTION
from .rows import BUSY_SHARE, MAX_LOSS_REL_DIFF, MAX_SPREAD, MIN_MEMORY_SAVING, MIN_SPEEDUP, ModeRow

PREFERENCE = {"bf16": 0, "fp16": 1, "fp8": 2}  # on a near tie: no scaler, fp32's range


def config_lines(mode: str) -> dict[str, str]:
    return {"accelerate_config": f"mixed_precision: {mode}",
            "code": f'Accelerator(mixed_precision="{mode}")',
            "launch": f"accelerate launch --mixed_precision {mode} train.py"}


def _usable(r: ModeRow) -> bool:
    return (r.ok and r.mode != "no" and bool(r.ran_as_requested) and r.nonfinite_count == 0
            and (r.skipped_steps or 0) <= MAX_SKIPPED_FRACTION * (r.steps or 1)
            and (r.loss_rel_diff is None or r.loss_rel_diff <= MAX_LOSS_REL_DIFF))


def _percent(v: float) -> str:
    """0.003 -> 0.3%, 1.4e-05 -> 0.0014%: small differences keep two figures."""
    return f"{v:.1%}" if v >= 0.001 else f"{v * 100:.2g}%"


def _gain_words(r: ModeRow) -> str:
    parts = []
    if r.speedup is not None and r.speedup_reliable is False:
        parts.append(f"speed-up unreliable ({speedup_range(r)})")
    elif r.speedup is not None:
        parts.append(f"{r.speedup:.2f}× faster than fp32" if r.speedup >= 1 else
                     f"{r.speedup:.2f}× the speed of fp32")
    if r.memory_saving is not None:
        parts.append(f"{r.memory_saving:.0%} less memory" if r.memory_saving >= 0 else
                     f"{-r.memory_saving:.0%} more memory")
    if r.loss_rel_diff is not None:
        parts.append(f"loss within {_percent(r.loss_rel_diff)}")
    return ", ".join(parts)


def speedup_range(r: ModeRow) -> str:
    """An unreliable speed-up as what it is: the interval it fell in ("0.54×–18.2×")."""
    n = r.rounds or 0
    if r.speedup_low is None or r.speedup_high is None or n <= 1:
        return f"{n} timed round" + ("" if n == 1 else "s")
    span = f"{_x(r.speedup_low)}–{_x(r.speedup_high)}"
    return span if n >= 5 else f"{span} over {n} rounds"


def _x(v: float) -> str:
    return f"{v:.3g}×"


def _why_not(r: ModeRow) -> str:
    if not r.ok:
        return f"{r.mode} failed ({r.findings[0].title if r.findings else r.error})"
    if not r.ran_as_requested:
        return f"{r.mode} did not run (first matmul {r.autocast_dtype})"
    if r.nonfinite_count:
        return f"{r.mode} produced non-finite values"
    if r.loss_rel_diff is not None and r.loss_rel_diff > MAX_LOSS_REL_DIFF:
        return f"{r.mode} loss is {r.loss_rel_diff:.1%} off fp32"
    return f"{r.mode}: {_gain_words(r)}"


def timing_noise(r: ModeRow) -> str | None:
    """Why this row's speed-up cannot be trusted, if it cannot. Timed in paired rounds,
    its interval says (a busy machine whose load is steady still gives a narrow one);
    otherwise the CPU's load and the spread of its step times. A row with no speed-up
    (a mode that did not run as asked) claims nothing to be unreliable about."""
    if r.speedup is None and r.speedup_reliable is None:
        return None
    if r.speedup_reliable is False:
        if r.speedup_low is None or r.speedup_high is None or (r.rounds or 0) < 5:
            n = r.rounds or 0
            return f"only {n} timed round{'' if n == 1 else 's'}, too few to judge"
        return f"its speed-up over fp32 ranged {speedup_range(r)} over {r.rounds} rounds"
    if r.speedup_reliable is True:
        return None
    if (r.cpu_used_by_others or 0) > BUSY_SHARE:
        return f"other processes used {r.cpu_used_by_others:.0%} of the CPUs"
    if (r.step_time_spread or 0) > MAX_SPREAD:
        return f"its step times varied ±{r.step_time_spread / 2:.0%}"
    return None


def recommend(rows: list[ModeRow], device_type: str | None = None) -> dict[str, Any]:
    """The mode to set, why, and the line to write. On a CPU whose timings were
    disturbed (a neighbour's job, wildly varying steps) no speed verdict is given:
    the working modes and what did not depend on timing are said instead."""
    rec = _recommend_timed(rows, device_type)
    fits = {r.mode: r.max_batch for r in rows if r.ok and r.max_batch is not None
            and (r.ran_as_requested or r.mode == "no")}
    if fits:
        rec["max_batch"] = fits
        words = batch_words(rows, rec.get("mode"))
        if words:
            rec["batch"] = words
    return rec


def batch_words(rows: list[ModeRow], pick: str | None) -> str | None:
    """"bf16 fits batch 48 where fp32 fits 24": the --max-batch result of the mode
    recommended (or of the leanest) against fp32's."""
    found = {r.mode: r for r in rows if r.ok and r.max_batch is not None and (r.ran_as_requested or r.mode == "no")}
    base = found.get("no")

    def size(r: ModeRow) -> str:
        s = r.max_batch_search or {}
        if s.get("bounded"):
            return f"{r.max_batch} or more (the search's upper bound)"
        return str(r.max_batch)
    others = [r for m, r in found.items() if m != "no"]
    if pick and pick != "no" and pick in found:
        r = found[pick]
    elif others:
        r = max(others, key=lambda x: x.max_batch or 0)
    else:
        return f"fp32 fits batch {size(base)}" if base else None
    if base is None:
        return f"{r.mode} fits batch {size(r)}"
    return f"{r.mode} fits batch {size(r)} where fp32 fits {size(base)}"


def _recommend_timed(rows: list[ModeRow], device_type: str | None) -> dict[str, Any]:
    noisy = {r.mode: timing_noise(r) for r in rows if r.ok and timing_noise(r)}
    rec = _recommend(rows)
    rec["timings_reliable"] = not noisy
    if not noisy or not rec.get("mode"):
        return rec
    why = "; ".join(f"{m}: {n}" for m, n in noisy.items())
    if device_type == "cpu" and rec.get("basis") in ("speed", "memory", "none faster"):
        working = [r for r in rows if r.ok and (r.ran_as_requested or r.mode == "no")]
        words = ", ".join(r.mode + (f" ({_gain_words_untimed(r)})" if r.mode != "no" and _gain_words_untimed(r) else "")
                          for r in working)
        out = {"mode": "no", "basis": "timings unreliable", "timings_reliable": False,
               "reason": (f"no, for now: the timings are unreliable ({why}). Modes that train here: {words}. "
                          "Re-run `mpdoctor probe` on an idle machine for a speed verdict."),
               "config": config_lines("no")}
        lean = [r for r in rows if _usable(r) and (r.memory_saving or 0) >= MIN_MEMORY_SAVING]
        if lean:
            alt = max(lean, key=lambda r: r.memory_saving or 0)
            out["if_memory_bound"] = {"mode": alt.mode, "reason": f"{alt.mode}: {_gain_words_untimed(alt)}",
                                      "config": config_lines(alt.mode)}
        return out
    rec["reason"] += f" — but the timings are unreliable ({why}): re-run it idle"
    return rec


def _gain_words_untimed(r: ModeRow) -> str:
    parts = []
    if r.memory_saving is not None:
        parts.append(f"{r.memory_saving:.0%} less memory" if r.memory_saving >= 0 else
                     f"{-r.memory_saving:.0%} more memory")
    if r.loss_rel_diff is not None:
        parts.append(f"loss within {_percent(r.loss_rel_diff)}")
    return ", ".join(parts)


def _recommend(rows: list[ModeRow]) -> dict[str, Any]:
    base = next((r for r in rows if r.mode == "no"), None)
    if base is None or not base.ok:
        working = [r for r in rows if r.ok and r.ran_as_requested]
        if not working:
            return {"mode": None, "reason": "no mode trained on this machine: see the findings", "config": None}
        pick = working[0]
        return {"mode": pick.mode, "reason": f"{pick.mode}: the only mode that trained (fp32 failed)",
                "config": config_lines(pick.mode)}
    usable = [r for r in rows if _usable(r)]
    others = [r for r in rows if r.mode != "no" and not r.baseline_only]
    faster = [r for r in usable if r.speedup is not None and r.speedup >= MIN_SPEEDUP]
    if faster:
        best = max(r.speedup for r in faster)
        near = [r for r in faster if r.speedup >= best / 1.05]
        pick = min(near, key=lambda r: PREFERENCE.get(r.mode, 9))
        return {"mode": pick.mode, "reason": f"{pick.mode}: {_gain_words(pick)}", "config": config_lines(pick.mode),
                "basis": "speed"}
    leaner = [r for r in usable if r.memory_saving is not None and r.memory_saving >= MIN_MEMORY_SAVING
              and r.speedup is not None and r.speedup >= 1 / MIN_SPEEDUP]
    if leaner:
        pick = max(leaner, key=lambda r: r.memory_saving or 0)
        return {"mode": pick.mode, "reason": f"{pick.mode}: {_gain_words(pick)} (as fast as fp32, less memory)",
                "config": config_lines(pick.mode), "basis": "memory"}
    why = "; ".join(_why_not(r) for r in others) or "no other mode was probed"
    rec: dict[str, Any] = {"mode": "no", "reason": f"no: no mixed-precision mode beat fp32 on this machine ({why})",
                           "config": config_lines("no"), "basis": "none faster"}
    trade = [r for r in usable if r.memory_saving is not None and r.memory_saving >= MIN_MEMORY_SAVING]
    if trade:
        alt = max(trade, key=lambda r: r.memory_saving or 0)
        rec["if_memory_bound"] = {"mode": alt.mode, "reason": f"{alt.mode}: {_gain_words(alt)}",
                                  "config": config_lines(alt.mode)}
    return rec
