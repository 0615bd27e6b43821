"""The renderers every face shares: terminal (rich), json, markdown.

They take a Report (plain data) and nothing else, and print nothing themselves: each
returns a string or writes to the console it is given.
"""

from __future__ import annotations

from typing import Any

from .findings import Finding, Report

FORMATS = ("terminal", "json", "markdown")
SYMBOL = {"error": "✗", "warning": "!", "info": "i"}
STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_SKIP_FACTS = {"derive_error"}


def to_json(report: Report) -> str:
    import json

    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n"


def _facts_line(f: Finding) -> str:
    parts = []
    for k, v in f.facts.items():
        if k in _SKIP_FACTS or k.endswith("_bytes"):
            continue
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def _evidence_label(line: int | None, source: str) -> str:
    if line is not None:
        return f"line {line}"
    return source


def to_markdown(report: Report, heading: str = "mpdoctor") -> str:
    out: list[str] = [f"## {heading}", ""]
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
        if f.evidence:
            out.append("**Evidence**")
            out.append("")
            out.append("```text")
            for e in f.evidence:
                out.append(f"{_evidence_label(e.line, e.source)}: {e.text}")
            out.append("```")
            out.append("")
        if f.fixes:
            out.append("**Fix**")
            out.append("")
            for n, fix in enumerate(f.fixes, 1):
                out.append(f"{n}. {fix}")
            out.append("")
        facts = _facts_line(f)
        if facts:
            out.append(f"<sub>facts: {facts}</sub>")
            out.append("")
        if f.references:
            out.append("References: " + ", ".join(f"<{r}>" for r in f.references))
            out.append("")
    if report.unrecognised:
        out.append("### Not recognised")
        out.append("")
        for u in report.unrecognised:
            out.append(f"- line {u.line}: `{u.exception}`{_unrecognised_tail(u)}")
        out.append("")
    return "\n".join(out)


def print_terminal(report: Report, console: Any, heading: str | None = None) -> None:
    """Rich output: one panel per finding, evidence with line numbers, numbered fixes."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.text import Text

    if heading:
        console.print(Text(heading, style="bold"))
    if not report.findings:
        console.print(Text(("✓ " if not report.unrecognised else "") + _nothing_found(report),
                           style="green" if not report.unrecognised else "yellow"))
    for f in report.findings:
        body = Text()
        body.append(f.title + "\n", style="bold")
        if f.explanation:
            body.append("\n" + f.explanation + "\n")
        if f.evidence:
            body.append("\nEvidence\n", style="bold")
            for e in f.evidence:
                label = _evidence_label(e.line, e.source)
                body.append(f"  {label:>10} │ ", style="dim")
                body.append(e.text + "\n")
        if f.fixes:
            body.append("\nFix\n", style="bold")
            for n, fix in enumerate(f.fixes, 1):
                body.append(f"  {n}. ", style="bold")
                body.append(fix + "\n")
        facts = _facts_line(f)
        if facts:
            body.append("\nfacts: " + facts + "\n", style="dim")
        if f.references:
            body.append("see: " + "  ".join(f.references) + "\n", style="dim")
        count = f" ×{f.count}" if f.count > 1 else ""
        ranks = f" (ranks {', '.join(map(str, f.ranks))})" if f.ranks else ""
        title = f"{SYMBOL[f.severity]} {f.severity}{count}{ranks} · {f.category} · {f.rule}"
        console.print(Panel(body, title=escape(title), title_align="left", border_style=STYLE[f.severity]))
    for u in report.unrecognised:
        line = Text("? not recognised, ", style="yellow")
        line.append(f"line {u.line}: ", style="dim")
        line.append(u.exception)
        line.append(_unrecognised_tail(u), style="dim")
        console.print(line)
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    if report.findings:
        console.print(Text(f"{len(report.findings)} finding(s): {errors} error, {warnings} warning, {infos} info",
                           style="bold"))


def _nothing_found(report: Report) -> str:
    if report.unrecognised:
        return ("No mixed-precision or GPU problem recognised. The error below is outside what "
                "mpdoctor knows:" if len(report.unrecognised) == 1 else
                "No mixed-precision or GPU problem recognised. The errors below are outside what "
                "mpdoctor knows:")
    return "No mixed-precision or GPU problem found."


def _unrecognised_tail(u: Any) -> str:
    where = f" (in {u.user_frame})" if u.user_frame else ""
    times = f" ×{u.count}" if u.count > 1 else ""
    ranks = f" (ranks {', '.join(map(str, u.ranks))})" if getattr(u, "ranks", None) else ""
    return where + times + ranks


def make_console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def emit(report: Report, fmt: str, *, stderr: bool = False, heading: str = "mpdoctor") -> None:
    """Write the report in `fmt` to stdout (or stderr, for `run`)."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    if fmt == "json":
        stream.write(to_json(report))
    elif fmt == "markdown":
        stream.write(to_markdown(report, heading))
    else:
        print_terminal(report, make_console(stderr=stderr))
    stream.flush()


# --- check's checklist: one line per area, the fix beneath (report.extra["checklist"]) ---

CHECK_SYMBOL = {"ok": "✓", "warning": "!", "error": "✗", "skipped": "–", "info": "i"}
CHECK_STYLE = {"ok": "green", "warning": "yellow", "error": "bold red", "skipped": "dim", "info": "cyan"}


def _mode_text(m: dict[str, Any]) -> str:
    runs = m.get("runs_as") or "—"
    reason = f": {m['reason']}" if m.get("reason") and m["status"] != "ok" else ""
    return f"{m['mode']:<5} runs as {runs}{reason}"


def _fp8_rows(fp8: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["backend"], r.get("installed") or "not installed",
             "usable" if r["usable"] else r.get("verdict", "")) for r in fp8]


def _skips_by_reason(skipped: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    grouped: dict[str, list[str]] = {}
    for s in skipped:
        grouped.setdefault(s["reason"], []).append(s["rule"])
    return list(grouped.items())


def print_checklist(report: Report, console: Any, heading: str = "mpdoctor check") -> None:
    """The glanceable form of `mpdoctor check`: environment, precision plan, one line
    per area (✓ / ! / ✗ / – skipped) with each finding's first fix beneath. Wrapped
    lines keep their indent, so the fix stays visibly under its finding."""
    from rich.padding import Padding
    from rich.text import Text

    def line(indent: int, *parts: tuple[str, str]) -> None:
        t = Text()
        for text, style in parts:
            t.append(text, style=style)
        console.print(Padding(t, (0, 0, 0, indent), expand=False))

    c = report.extra.get("checklist", {})
    console.print(Text(heading, style="bold"))
    for text in c.get("environment", []):
        line(2, (text, "dim"))
    console.print(Text("Precision plan", style="bold"))
    for text in c.get("plan", []):
        line(2, (text, ""))
    for m in c.get("modes", []):
        line(2, (CHECK_SYMBOL.get(m["status"], "?") + " ", CHECK_STYLE.get(m["status"], "")), (_mode_text(m), ""))
    console.print(Text("Checklist", style="bold"))
    for area in c.get("areas", []):
        strong = "bold" if area["status"] in ("error", "warning") else ""
        line(1, (CHECK_SYMBOL[area["status"]] + " ", CHECK_STYLE[area["status"]]), (area["title"], strong),
             ("  " + area["summary"] if area.get("summary") else "", "dim"))
        for item in area.get("items", []):
            count = f" (×{item['count']})" if item.get("count", 1) > 1 else ""
            line(5, (SYMBOL.get(item["severity"], "?") + " ", STYLE.get(item["severity"], "")),
                 (item["title"] + count, ""), (f"  [{item['rule']}]", "dim"))
            if item.get("fix"):
                line(7, ("→ " + item["fix"], "cyan"))
    if c.get("fp8"):
        console.print(Text("fp8 backends", style="bold"))
        for name, installed, verdict in _fp8_rows(c["fp8"]):
            line(2, (f"{name:<18} {installed:<16} {verdict}", ""))
    probe = report.extra.get("probe") or {}
    if probe.get("lines"):
        console.print(Text("Probe", style="bold"))
        for text in probe["lines"]:
            line(2, (text, ""))
    skipped = c.get("skipped", [])
    if skipped:
        console.print(Text(f"Skipped ({len(skipped)}): not judged here, neither passed nor failed", style="bold"))
        for reason, rules in _skips_by_reason(skipped):
            line(2, (f"– {reason}: {', '.join(rules)}", "dim"))
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    style = "bold red" if errors else ("yellow" if warnings else "green")
    console.print(Text(f"{errors} error(s), {warnings} warning(s), {infos} note(s) — "
                       "details: --format markdown or json", style=style))


def to_checklist_markdown(report: Report, heading: str = "mpdoctor check") -> str:
    """The block a user pastes into a bug report: the checklist, then every finding."""
    c = report.extra.get("checklist", {})
    out = [f"## {heading}", "", "**Environment**", ""]
    out += [f"- {line}" for line in c.get("environment", [])] + ["", "**Precision plan**", ""]
    out += [f"- {line}" for line in c.get("plan", [])]
    if c.get("modes"):
        out += ["", "| mode | verdict | runs as | why |", "|---|---|---|---|"]
        for m in c["modes"]:
            out.append(f"| {m['mode']} | {CHECK_SYMBOL.get(m['status'], '?')} {m['status']} | "
                       f"{m.get('runs_as') or '—'} | {m.get('reason') or ''} |")
    out += ["", "**Checklist**", ""]
    for area in c.get("areas", []):
        summary = f" — {area['summary']}" if area.get("summary") else ""
        out.append(f"- {CHECK_SYMBOL[area['status']]} **{area['title']}**{summary}")
        for item in area.get("items", []):
            count = f" (×{item['count']})" if item.get("count", 1) > 1 else ""
            out.append(f"  - {SYMBOL.get(item['severity'], '?')} {item['title']}{count} (`{item['rule']}`)")
            if item.get("fix"):
                out.append(f"    - fix: {item['fix']}")
    if c.get("fp8"):
        out += ["", "**fp8 backends**", "", "| backend | installed | verdict |", "|---|---|---|"]
        out += [f"| {a} | {b} | {v} |" for a, b, v in _fp8_rows(c["fp8"])]
    probe = report.extra.get("probe") or {}
    if probe.get("lines"):
        out += ["", "**Probe**", ""] + [f"    {line}" for line in probe["lines"]]
    if c.get("skipped"):
        out += ["", "<details><summary>Skipped checks (not judged here)</summary>", ""]
        out += [f"- {reason}: " + ", ".join(f"`{r}`" for r in rules) for reason, rules in _skips_by_reason(c["skipped"])]
        out += ["", "</details>"]
    out.append("")
    if report.findings:
        out.append(to_markdown(report, "Findings").replace("## Findings", "### Findings", 1))
    return "\n".join(out)
