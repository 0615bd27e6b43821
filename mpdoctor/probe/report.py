"""The probe's report: plain data, and its three renderings (json, markdown, terminal).

The per-mode table is the probe's own; the findings under it go through the shared
renderers in mpdoctor/render.py, like every other face's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..findings import Finding, Report, rank_findings
from ..knowledge.units import gib
from .recommend import speedup_range, timing_noise
from .rows import BUSY_SHARE, ModeRow


@dataclass
class ProbeReport:
    rows: list[ModeRow]
    recommendation: dict[str, Any]
    device: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    overhead: dict[str, Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def findings(self) -> list[Finding]:
        return rank_findings([f for r in self.rows for f in r.findings])

    @property
    def any_mode_works(self) -> bool:
        return any(r.ok and (r.ran_as_requested or r.mode == "no") for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"modes": [r.to_dict() for r in self.rows], "recommendation": self.recommendation,
                "device": self.device, "workload": self.workload, "overhead": self.overhead,
                "options": self.options, "wall_s": round(self.wall_s, 2),
                "findings": [f.to_dict() for f in self.findings]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n"


# -- cells ------------------------------------------------------------------------

def _x(v: float | None, row: ModeRow) -> str:
    if row.ok and not row.ran_as_requested and row.mode != "no":
        return "n/a"
    if v is not None and row.speedup_reliable is False:
        # never a plain number: the interval it fell in, or how few rounds there were
        return f"unreliable ({speedup_range(row)})"
    return "–" if v is None else f"{v:.2f}×"


def _pct(v: float | None, row: ModeRow) -> str:
    if row.ok and not row.ran_as_requested and row.mode != "no":
        return "n/a"
    return "–" if v is None else f"{v:.0%}"


def _rel(v: float | None) -> str:
    if v is None:
        return "–"
    if not math.isfinite(v):
        return "inf"
    return f"{v:.2%}" if v >= 1e-4 else f"{v * 100:.1g}%"


def _time(row: ModeRow) -> str:
    if row.step_time_s is None:
        return "–"
    s = f"{row.step_time_s * 1000:.1f} ms"
    if row.step_time_reliable is False:
        s = "~" + s
    if row.step_time_spread is not None:
        s += f" ±{row.step_time_spread / 2:.0%}"
    return s


def _works(row: ModeRow) -> str:
    if not row.ok:
        return "✗ timed out" if row.timed_out else "✗ failed"
    if row.mode != "no" and not row.ran_as_requested:
        return f"! ran {row.autocast_dtype}"
    return "✓"


def _scaler(row: ModeRow) -> str:
    if not row.ok:
        return "–"
    if row.final_scale is None and not row.skipped_steps:
        return "none"
    scale = "–" if row.final_scale is None else f"{row.final_scale:g}"
    return f"{row.skipped_steps or 0} skipped, scale {scale}"


def _peak(v: float | None) -> str:
    if v is None:
        return "–"
    return "inf" if not math.isfinite(v) else f"{v:.3g}"


COLUMNS = ["mode", "works", "step time", "speed-up", "peak memory", "saving", "loss Δ", "logits Δ",
           "autocast", "loss scaler", "non-finite", "fp16 headroom"]


def _room(v: float | None) -> str:
    if v is None:
        return "–"
    if v == 0 or not math.isfinite(v):
        return "overflow" if v == 0 else "–"
    return f"{v:.3g}×" if v < 1000 else f"{v:.1e}×".replace("e+0", "e").replace("e+", "e")


def _min_fp16_room(row: ModeRow) -> str:
    if not row.ok or not row.fp16_headroom:
        return "–"
    return _room(row.fp16_headroom[0].get("fp16_headroom"))


def _max_batch(row: ModeRow) -> str:
    if not row.ok or row.max_batch is None:
        return "–"
    s = row.max_batch_search or {}
    return f"≥{row.max_batch}" if s.get("bounded") else str(row.max_batch)


def table_rows(report: ProbeReport) -> tuple[list[str], list[list[str]]]:
    cols = list(COLUMNS)
    stress = bool(report.options.get("stress"))
    if stress:
        cols.append("peak activation")
    search = any(r.max_batch_search for r in report.rows)
    if search:
        cols.append("max batch")
    body = []
    for r in report.rows:
        cells = [r.mode + (" (baseline)" if r.baseline_only else ""), _works(r), _time(r),
                 _x(r.speedup, r), gib(r.peak_memory_bytes) or "–", _pct(r.memory_saving, r),
                 "ref" if r.mode == "no" and r.ok else _rel(r.loss_rel_diff),
                 "ref" if r.mode == "no" and r.ok else _rel(r.logits_rel_diff), r.autocast_dtype or "–", _scaler(r),
                 str(r.nonfinite_count) if r.ok else "–", _min_fp16_room(r)]
        if stress:
            cells.append(_peak(r.peak_activation))
        if search:
            cells.append(_max_batch(r))
        body.append(cells)
    return cols, body


def _footer_lines(report: ProbeReport) -> list[str]:
    """The lines under the table, each one logical line (the faces wrap them: a `code
    span` is never cut)."""
    lines = []
    rec = report.recommendation
    if rec.get("mode"):
        lines.append(f"Recommendation: {rec['reason']}")
        cfg = rec.get("config") or {}
        lines.append(f"  accelerate config: `{cfg.get('accelerate_config')}`")
        lines.append(f"  code: `{cfg.get('code')}`")
    else:
        lines.append(f"Recommendation: none — {rec.get('reason')}")
    alt = rec.get("if_memory_bound")
    if alt:
        lines.append(f"  If memory is your limit: {alt['reason']} → `{alt['config']['accelerate_config']}`")
    if rec.get("batch"):
        lines.append(f"  Largest batch that trains: {rec['batch']}{_cap_words(report)}")
    lines += _headroom_lines(report)
    for r in report.rows:
        if r.error:
            lines.append(f"{r.mode}: {r.error}")
        elif r.note:
            lines.append(f"{r.mode}: {r.note}")
        if r.ok and (r.max_batch_search or {}).get("error"):
            lines.append(f"{r.mode}: --max-batch found no answer: {r.max_batch_search['error']}")
    lines += _timing_lines(report)
    d, w = report.device, report.workload
    if d:
        extra = f", {d.get('threads')} threads" if d.get("threads") else ""
        cap = f", {d.get('capability')}" if d.get("capability") else ""
        lines.append(f"Device: {d.get('type')} {d.get('name', '')}{cap}{extra}; torch {d.get('torch')}, "
                     f"accelerate {report.options.get('accelerate', '?')}")
    if w:
        name = w.get("model")
        if w.get("spec") and w.get("spec") != name:
            name = f"{name} from {w['spec']}"
        lines.append(f"Model: {name} ({w.get('parameters', 0):,} parameters, batch {w.get('batch_size')}), "
                     f"{_steps_words(report)}; memory: {_memory_kind(report)}; wall time {report.wall_s:.1f} s")
        if w.get("spec"):
            lines.append(f"Batch: {w.get('batch')}; loss: {w.get('loss')}")
    return lines


def _steps_words(report: ProbeReport) -> str:
    o = report.options
    rounds = o.get("rounds")
    if not rounds:
        return f"{o.get('steps')} steps per mode, median after {o.get('warmup')} warm-up steps"
    k = o.get("round_steps") or 1
    each = f"{k} steps per mode, the fastest counted" if k > 1 else "1 step per mode"
    warm = o.get("warmup")
    return (f"{warm} warm-up step{'' if warm == 1 else 's'}, then {rounds} timed round{'' if rounds == 1 else 's'} of {each} "
            "(the modes in turn)")


def _timing_lines(report: ProbeReport) -> list[str]:
    """Whether the timings can be trusted, why not, and what the instrumentation costs:
    a figure that cannot be trusted is given as the range it fell in, never alone."""
    lines = []
    ok = [r for r in report.rows if r.ok]
    noisy = [(r, timing_noise(r)) for r in ok if timing_noise(r)]
    busy = [r for r in ok if r.cpu_used_by_others is not None and r.cpu_used_by_others > BUSY_SHARE]
    worst = max((r.cpu_used_by_others or 0 for r in busy), default=0)
    if noisy:
        lines.append("Timings are unreliable: " + "; ".join(f"{r.mode}: {why}" for r, why in noisy)
                     + (f" (other processes used up to {worst:.0%} of the CPUs)" if busy else "")
                     + ". Run the probe on an idle machine for a speed verdict.")
    elif busy:
        steady = [r for r in ok if r.mode != "no" and r.speedup_reliable]
        lines.append(f"Other processes used up to {worst:.0%} of the CPUs while {', '.join(r.mode for r in busy)} ran"
                     + ("; the modes were timed in turn, round by round, and their speed-ups held steady."
                        if steady else "."))
    oh = report.overhead
    if oh and oh.get("ratio") is not None:
        if "reliable" in oh:
            reliable = bool(oh.get("reliable"))
            how = f"{oh['steps']} pairs of steps with and without it in the fp32 child"
        else:  # an older result: k steps with, then k without
            reliable = not any(r.mode == "no" for r in busy)
            how = f"{oh['steps']} steps with vs without it in the fp32 child"
        if reliable:
            figure = f"{oh['ratio']:.2f}× step time ({oh.get('source')}; {how})"
        elif oh.get("low") is not None and oh.get("high") is not None:
            figure = f"unreliable ({oh['low']:.3g}×–{oh['high']:.3g}× step time; {oh.get('source')}; {how})"
        else:
            figure = f"unreliable ({oh.get('source')}; {how}; the machine was busy)"
        lines.append(f"Instrumentation overhead: {figure}. It watches each mode's warm-up steps; the timed "
                     "steps run without it, so the speed-ups compare precisions, not instrumentation.")
    return lines


def _cap_words(report: ProbeReport) -> str:
    caps = {(r.max_batch_search or {}).get("cap") for r in report.rows if r.max_batch_search}
    caps.discard(None)
    limit = report.options.get("memory_limit")
    if limit:
        return f" (address space capped at {gib(limit)} by --memory-limit)"
    return f" (bounded by {', '.join(sorted(caps))})" if caps else ""


def _headroom_lines(report: ProbeReport) -> list[str]:
    """The modules closest to overflow: fp32's against fp16's limit (what fp16 would
    face), and each low-precision mode's against its own dtype's."""
    lines = []
    for r in report.rows:
        if not r.ok:
            continue
        if r.first_nonfinite_module:
            f = r.first_nonfinite_module
            lines.append(f"  {r.mode}: first non-finite output: {f['module']} ({f.get('type')}, {f.get('dtype')}, "
                         f"{'evaluation' if not f.get('step') else 'step ' + str(f['step'])})")
            continue
        if r.mode == "no" or not r.ran_as_requested:
            items, label = r.fp16_headroom, "against fp16's 65504"
        else:
            items, label = r.headroom, f"against {r.autocast_dtype}'s largest value"
        key = "fp16_headroom" if "fp16" in label else "headroom"
        named = [f"{h['module']} {h['absmax']:.3g} ({_room(h.get(key))})" for h in items[:3] if h.get("absmax") is not None]
        if named:
            lines.append(f"  {r.mode}: {', '.join(named)}")
            lines[-1] = lines[-1].replace(f"  {r.mode}: ", f"  {r.mode} ({label}): ", 1)
    if lines:
        lines.insert(0, "Headroom: the largest |output| of the modules closest to overflow, and how many times "
                        "it could grow before it does:")
    return lines


def _memory_kind(report: ProbeReport) -> str:
    kinds = {r.memory_kind for r in report.rows if r.memory_kind}
    names = {"rss_peak_growth": "peak RSS growth over the training loop",
             "ru_maxrss_growth": "max RSS growth over the training loop",
             "cuda.max_memory_allocated": "torch.cuda.max_memory_allocated",
             "mps.current_allocated_memory": "torch.mps.current_allocated_memory after the loop"}
    return ", ".join(names.get(k, k) for k in sorted(kinds)) or "not measured"


RIGHT = frozenset(c for c in COLUMNS + ["peak activation", "max batch"]
                  if c not in ("mode", "works", "autocast", "loss scaler"))


def _table(cols: list[str], body: list[list[str]], width: int) -> list[str]:
    """The one table renderer every face uses (render.table_lines): a plain table when
    it fits, else one column per mode, else stacked; no cell cut, no trailing space."""
    from ..render import table_lines

    try:
        return table_lines(cols, body, width, right=RIGHT, transpose=True)
    except TypeError:  # a render without the column-per-mode layout
        return table_lines(cols, body, width, right=RIGHT)


def to_text_lines(report: ProbeReport, width: int = 80) -> list[str]:
    """The table and the footer as plain text within `width` columns (a `code span`,
    a URL or a path longer than that on a line of its own): for reports that embed
    the probe, and the terminal face."""
    from ..render import wrap

    cols, body = table_rows(report)
    lines = _table(cols, body, width)
    for line in _footer_lines(report):
        text = line.lstrip()
        indent = len(line) - len(text)
        lines += wrap(text, width, indent=indent, first="", rest="  ")
    return lines


def to_markdown(report: ProbeReport, heading: str = "mpdoctor probe", findings: bool = True) -> str:
    from ..render import markdown_table
    from ..render import to_markdown as findings_markdown

    cols, body = table_rows(report)
    out = [f"## {heading}", ""] + markdown_table(cols, body) + [""]
    for line in _footer_lines(report):
        out += [line.strip(), ""]  # a paragraph each; never indented into a code block
    if findings and report.findings:
        out.append(findings_markdown(Report(findings=report.findings), heading="Findings").replace("## Findings", "### Findings", 1))
    return "\n".join(out)


def print_terminal(report: ProbeReport, console: Any, findings: bool = True) -> None:
    from rich.text import Text

    from ..render import print_terminal as print_findings

    try:
        width = max(40, int(console.width))
    except (TypeError, ValueError, AttributeError):
        width = 80

    def say(line: str, style: str | None = None) -> None:  # exactly as given: no wrap, crop or padding
        console.print(Text(line, style=style, no_wrap=True, overflow="ignore", end="\n"), soft_wrap=True, crop=False)

    say("mpdoctor probe", "bold")
    for line in to_text_lines(report, width):
        say(line, "bold green" if line.startswith("Recommendation") else None)
    if findings and report.findings:
        console.print()
        print_findings(Report(findings=report.findings), console)
