"""The renderers every face shares: terminal (rich), json, markdown.

They take a Report (plain data) and nothing else, and print nothing themselves: each
returns a string or writes to the console it is given.
"""

from __future__ import annotations

import json
from typing import Any

from .findings import Finding, Report

FORMATS = ("terminal", "json", "markdown")
SYMBOL = {"error": "✗", "warning": "!", "info": "i"}
STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_SKIP_FACTS = {"derive_error"}


def to_json(report: Report) -> str:
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
        out.append("No mixed-precision or GPU problem found.")
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
            where = f" (from {u.user_frame})" if u.user_frame else ""
            times = f" ×{u.count}" if u.count > 1 else ""
            out.append(f"- line {u.line}: `{u.exception}`{where}{times}")
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
        console.print(Text("✓ No mixed-precision or GPU problem found.", style="green"))
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
        where = f" (from {u.user_frame})" if u.user_frame else ""
        times = f" ×{u.count}" if u.count > 1 else ""
        console.print(Text(f"? not recognised, line {u.line}: {u.exception}{where}{times}", style="dim"))
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    if report.findings:
        console.print(Text(f"{len(report.findings)} finding(s): {errors} error, {warnings} warning, {infos} info",
                           style="bold"))


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
