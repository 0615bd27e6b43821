"""`check`'s checklist: one line per area, the fix beneath (report.extra["checklist"]),
the per-mode verdicts and the fp8 table, in the terminal and in markdown."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import Any

from ..findings import Report
from .common import SCHEMAS, STYLE, SYMBOL, _facts_line, clean_report, to_json
from .markdown import to_markdown
from .terminal import _width, make_console, say, to_oneline
from .text import markdown_table, table_lines, wrap

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


def print_checklist(report: Report, console: Any, heading: str = "mpdoctor check", *, anonymize: bool = False,
                    verbose: bool = False) -> None:
    """The glanceable form of `mpdoctor check`: environment, precision plan, one line
    per area (✓ / ! / ✗ / – skipped) with each finding's first fix beneath. Wrapped
    lines keep their indent (broken at spaces only), so the fix stays visibly under its
    finding and a command in it copies whole."""
    from ..redact import scrub

    report = clean_report(report, anonymize)
    heading = scrub(heading, anonymize)
    width = _width(console)

    def line(indent: int, text: str, style: str = "", lead: str = "", lead_style: str = "", hang: int = 0) -> None:
        lines = wrap(text, width, indent=indent, first=lead, rest=" " * (len(lead) + hang))
        head = indent + len(lead)
        say(console, (lines[0][:head], lead_style), (lines[0][head:], style))
        for extra in lines[1:]:
            say(console, (extra, style))

    c = report.extra.get("checklist", {})
    say(console, (heading, "bold"))
    for text in c.get("environment", []):
        line(2, text, "dim", hang=2)
    say(console, ("Precision plan", "bold"))
    for text in c.get("plan", []):
        line(2, text, hang=2)
    for m in c.get("modes", []):
        line(2, _mode_text(m), "", CHECK_SYMBOL.get(m["status"], "?") + " ", CHECK_STYLE.get(m["status"], ""))
    say(console, ("Checklist", "bold"))
    for area in c.get("areas", []):
        strong = "bold" if area["status"] in ("error", "warning") else ""
        text = area["title"] + (" — " + area["summary"] if area.get("summary") else "")
        line(1, text, strong, CHECK_SYMBOL[area["status"]] + " ", CHECK_STYLE[area["status"]])
        for item in area.get("items", []):
            count = f" (×{item['count']})" if item.get("count", 1) > 1 else ""
            line(5, f"{item['title']}{count}  [{item['rule']}]", "", SYMBOL.get(item["severity"], "?") + " ",
                 STYLE.get(item["severity"], ""))
            if item.get("fix"):
                line(7, item["fix"], "cyan", "→ ", "cyan")
    if c.get("fp8"):
        say(console, ("fp8 backends", "bold"))
        rows = [list(r) for r in _fp8_rows(c["fp8"])]
        for text in table_lines(["backend", "installed", "verdict"], rows, width - 2):
            say(console, ("  " + text if text else "", ""))
    probe = report.extra.get("probe") or {}
    if probe.get("lines"):
        say(console, ("Probe", "bold"))
        table = probe.get("table") or {}
        if table.get("columns") and table.get("rows"):
            body = table_lines(table["columns"], table["rows"], width - 2, transpose=True)
            footer = probe.get("footer") or []
        else:  # a probe that did not run: its lines say why
            body, footer = [], probe["lines"]
        for text in body:
            say(console, ("  " + text if text else "", ""))
        for text in footer:
            stripped = text.lstrip()
            line(2 + len(text) - len(stripped), stripped, hang=2)
    skipped = c.get("skipped", [])
    if skipped:
        say(console, (f"Skipped ({len(skipped)}): not judged here, neither passed nor failed", "bold"))
        for reason, rules in _skips_by_reason(skipped):
            line(2, f"{reason}: {', '.join(rules)}", "dim", "– ", "dim")
    if verbose:
        for f in report.findings:
            facts = _facts_line(f)
            if facts:
                line(2, f"[{f.rule}] facts: {facts}", "dim")
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    unjudged = c.get("not_judged")
    style = "bold red" if errors else ("yellow" if warnings or unjudged else "green")
    if unjudged:
        line(0, f"not judged: {unjudged}", "yellow")
    line(0, f"{errors} error(s), {warnings} warning(s), {infos} note(s)"
         + (" in what could be judged" if unjudged else "") + " — details: --format markdown or json", style)


def to_checklist_markdown(report: Report, heading: str = "mpdoctor check", *, anonymize: bool = False,
                          verbose: bool = False) -> str:
    """The block a user pastes into a bug report: the checklist, then every finding."""
    from ..redact import markdown_safe, scrub

    report = clean_report(report, anonymize)
    heading = scrub(heading, anonymize)
    from .. import __version__

    c = report.extra.get("checklist", {})
    out = [f"## {heading}", ""]
    if c.get("not_judged"):
        out += [f"> **Not judged:** {c['not_judged']}", ""]
    out += ["**Environment**", "", f"- mpdoctor {__version__}"]
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
        out += ["", "**fp8 backends**", ""]
        out += markdown_table(["backend", "installed", "verdict"], [list(r) for r in _fp8_rows(c["fp8"])])
    probe = report.extra.get("probe") or {}
    if probe.get("lines"):
        out += ["", "**Probe**", ""]
        table = probe.get("table") or {}
        if table.get("columns") and table.get("rows"):
            out += markdown_table(table["columns"], table["rows"]) + [""]
            for line in probe.get("footer") or []:
                out += [line.strip(), ""]
            if out[-1] == "":
                out.pop()
        else:
            out += [line.strip() for line in probe["lines"]]
    config = (report.extra.get("environment") or {}).get("accelerate_config")
    if config:
        import json

        out += ["", f"<details><summary>accelerate config ({config.get('path')}), secrets redacted</summary>", "",
                "```json", json.dumps(config.get("config"), indent=2, ensure_ascii=False, default=str), "```", "",
                "</details>"]
    if c.get("skipped"):
        out += ["", "<details><summary>Skipped checks (not judged here)</summary>", ""]
        out += [f"- {reason}: " + ", ".join(f"`{r}`" for r in rules) for reason, rules in _skips_by_reason(c["skipped"])]
        out += ["", "</details>"]
    out.append("")
    if report.findings:
        out.append(to_markdown(report, "Findings", verbose=verbose).replace("## Findings", "### Findings", 1))
    return markdown_safe(scrub("\n".join(out), anonymize))


def emit_checklist(report: Report, fmt: str, heading: str = "mpdoctor check", *, anonymize: bool = False,
                   verbose: bool = False, where: str = "check") -> None:
    """`mpdoctor check`'s one way out: checklist (terminal), markdown, json, oneline."""
    import sys

    if fmt == "json":
        sys.stdout.write(to_json(report, schema=SCHEMAS["check"], anonymize=anonymize))
    elif fmt == "markdown":
        sys.stdout.write(to_checklist_markdown(report, heading, anonymize=anonymize, verbose=verbose))
    elif fmt == "oneline":
        sys.stdout.write(to_oneline(report, where, anonymize=anonymize))
    else:
        print_checklist(report, make_console(anonymize=anonymize, plain_ok=True), heading, anonymize=anonymize, verbose=verbose)
    sys.stdout.flush()
