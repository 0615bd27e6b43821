"""Markdown for a GitHub issue: heading, environment block, one section per finding,
long evidence folded in <details>; a run's command, exit and last lines."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import Any

from ..findings import Report
from .common import SYMBOL, _evidence_label, _facts_line, _nothing_found, _unrecognised_tail, clean_report
from .text import _series, sparkline

# --- environment block (markdown) -------------------------------------------------------

def environment_from_snapshot(snap: dict[str, Any]) -> dict[str, str]:
    """mpdoctor, Python, torch, accelerate, GPU, driver from an environment snapshot."""
    from .. import __version__

    def get(*path: str) -> Any:
        cur: Any = snap
        for p in path:
            if not isinstance(cur, dict):
                return None
            cur = cur.get(p)
        return cur

    env: dict[str, str] = {"mpdoctor": __version__}
    py = get("platform", "python")
    system = " ".join(str(x) for x in (get("platform", "system"), get("platform", "machine")) if x)
    env["Python"] = f"{py} ({system})" if py and system else str(py or "unknown")
    versions = get("packages", "versions") or {}
    torch_v = get("torch", "version") or versions.get("torch")
    cuda = get("torch", "cuda_build")
    env["torch"] = (f"{torch_v}" + (f" (CUDA {cuda})" if cuda else "")) if torch_v else "not installed"
    env["accelerate"] = versions.get("accelerate") or "not installed"
    gpus = get("nvml", "gpus") or []
    names = [g.get("name") for g in gpus if isinstance(g, dict) and g.get("name")]
    if not names:
        names = [d.get("name") for d in (get("torch", "devices") or []) if isinstance(d, dict) and d.get("name")]
    env["GPU"] = gpu_summary(names) or "none found"
    env["driver"] = str(get("nvml", "driver_version") or "none found")
    system = " · ".join(str(x) for x in (get("platform", "os"), get("platform", "libc")) if x)
    if system:
        env["OS"] = system
    env["numpy"] = versions.get("numpy") or "not installed"
    return env


def gpu_summary(names: list[str]) -> str:
    if not names:
        return ""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c}× {n}" if c > 1 else n for n, c in counts.items())


def _environment_markdown(env: dict[str, str]) -> list[str]:
    return ["**Environment**", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]


# --- markdown -------------------------------------------------------------------------

_FOLD_EVIDENCE = 12  # evidence longer than this folds in <details>
_FOLD_UNRECOGNISED = 5


def to_markdown(report: Report, heading: str = "mpdoctor", *, anonymize: bool = False, verbose: bool = False,
                environment: dict[str, str] | None = None) -> str:
    """The block a user pastes into a GitHub issue: heading, environment (when known),
    one section per finding; long evidence and lists folded in <details>."""
    from ..redact import Scrubber, markdown_safe

    report = clean_report(report, anonymize)
    heading = Scrubber(anonymize).text(heading)
    out: list[str] = [f"## {heading}", ""]
    if environment:
        out += _environment_markdown(Scrubber(anonymize).obj(environment))
    if "exit_code" in report.extra:  # a wrapped run: what ran, how it ended, how its output ended
        out += _run_markdown(report)
    if not report.findings:
        out.append(_nothing_found(report))
        out.append("")
    for i, f in enumerate(report.findings, 1):
        count = f" (×{f.count}" + (f", ranks {', '.join(map(str, f.ranks))}" if f.ranks else "") + ")" if f.count > 1 else ""
        out.append(f"### {i}. {SYMBOL[f.severity]} {f.severity}: {f.title}{count}")
        out.append("")
        out.append(f"`{f.category}` · rule `{f.rule}`")
        out.append("")
        if f.explanation:
            out.append(f.explanation)
            out.append("")
        for name, series in _series(f):
            out += [f"{name}: `{sparkline(series)}` ({_num(series[0])} → {_num(series[-1])}, {len(series)} values)", ""]
        if f.evidence:
            fold = len(f.evidence) > _FOLD_EVIDENCE
            out += [f"<details><summary>Evidence ({len(f.evidence)} lines)</summary>", ""] if fold else ["**Evidence**", ""]
            out.append("```text")
            for e in f.evidence:
                out.append(f"{_evidence_label(e.line, e.source)}: {e.text}")
            out.append("```")
            out += ["", "</details>", ""] if fold else [""]
        if f.fixes:
            out.append("**Fix**")
            out.append("")
            for n, fix in enumerate(f.fixes, 1):
                out.append(f"{n}. {fix}")
            out.append("")
        facts = _facts_line(f)
        if facts and verbose:
            out += ["<details><summary>facts</summary>", "", f"`{facts}`", "", "</details>", ""]
        if f.references:
            out.append("References: " + ", ".join(f"<{r}>" for r in f.references))
            out.append("")
    if report.unrecognised:
        fold = len(report.unrecognised) > _FOLD_UNRECOGNISED
        out += ([f"<details><summary>Not recognised ({len(report.unrecognised)})</summary>", ""] if fold
                else ["### Not recognised", ""])
        for u in report.unrecognised:
            out.append(f"- line {u.line}: `{u.exception}`{_unrecognised_tail(u)}")
        out += ["", "</details>", ""] if fold else [""]
    return markdown_safe(Scrubber(anonymize).text("\n".join(out)))


def _fence(lines: list[str]) -> str:
    """A code fence no line of `lines` can close (a log may print ``` itself)."""
    import re

    longest = max((len(m) for line in lines for m in re.findall(r"`{3,}", line)), default=0)
    return "`" * max(3, longest + 1)


def _run_markdown(report: Report) -> list[str]:
    """`run`'s own block: the command line, its exit status and why, the output's
    size and wall time, and its last lines (all scrubbed already by clean_report)."""
    import shlex

    extra = report.extra
    command = extra.get("command") or []
    code, signal = extra.get("exit_code"), extra.get("signal")
    if signal:
        status = f"{code} (killed by {signal})"
    elif code == 0:
        status = "0 (success)"
    else:
        status = f"{code} (the command's own exit status)"
    cmd = shlex.join(str(c) for c in command) if command else "(unknown)"
    if "\n" in cmd or "`" in cmd or len(cmd) > 70:
        fence = _fence([cmd])
        out = ["**Run**", "", fence + "sh", cmd, fence, "", f"- exit status: {status}"]
    else:
        out = ["**Run**", "", f"- command: `{cmd}`", f"- exit status: {status}"]
    size, wall = report.input.get("bytes"), report.input.get("wall_s")
    if size is not None or wall is not None:
        out.append("- output: " + ", ".join(x for x in (f"{size} bytes" if size is not None else "",
                                                         f"{wall} s" if wall is not None else "") if x))
    if report.input.get("instrumented") is False:
        out.append(f"- not instrumented: {report.input.get('not_instrumented') or 'no record came back'}")
    tail = [str(x) for x in extra.get("log_tail") or []]
    if tail:
        fence = _fence(tail)
        out += ["", f"<details><summary>The output's last lines ({len(tail)})</summary>", "",
                fence + "text", *tail, fence, "", "</details>"]
    return out + [""]


def _num(v: float) -> str:
    return f"{v:g}"
