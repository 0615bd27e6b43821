"""The renderers every face shares: terminal, oneline, json, markdown.

They take a Report (plain data) and nothing else, and print nothing themselves: each
returns a string or writes to the console it is given. Every one of them scrubs the
report first (mpdoctor/redact.py: secrets always, home/user/host with --anonymize), so
whatever leaves mpdoctor through them carries no secret.

The terminal layout is plain indented text (no panels): URLs, commands and code spans
are never cut by wrapping (lines break at spaces, a `code span` or URL stays whole on
its line even when it is longer than the terminal), no line carries trailing padding.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import Any

from .findings import Evidence, Finding, Report, Unrecognised
from .redact import _Lazy  # a pattern compiled on first use (json output needs none of these)

FORMATS = ("terminal", "json", "markdown", "oneline")
SYMBOL = {"error": "✗", "warning": "!", "info": "i"}
STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_SKIP_FACTS = {"derive_error"}

# The JSON contracts, one per face (docs/json-*.md). A version changes only when a key
# is removed or changes meaning; new keys may appear within a version.
SCHEMAS = {
    "explain": "mpdoctor.explain/1",
    "run": "mpdoctor.run/1",
    "check": "mpdoctor.check/1",
    "probe": "mpdoctor.probe/1",
}


# --- scrubbing ------------------------------------------------------------------------

def clean_report(report: Report, anonymize: bool = False) -> Report:
    """A copy of `report` with every secret cut (and home/user/host hidden with
    `anonymize`). Evidence keeps its line numbers; only the secret bytes change.
    Facts are mpdoctor's own vocabulary: their values are scrubbed, their names kept."""
    from .redact import Scrubber

    s = Scrubber(anonymize)

    def finding(f: Finding) -> Finding:
        return f.replace(
            title=s.text(f.title), explanation=s.text(f.explanation), fixes=[s.text(x) for x in f.fixes],
            evidence=[Evidence(text=s.text(e.text), line=e.line, source=s.text(e.source)) for e in f.evidence],
            facts=s.obj(f.facts, by_name=False), references=[s.text(r) for r in f.references],
            ranks=list(f.ranks),
            # numeric series only (for the sparklines): nothing else of the helper facts leaves
            all_facts={k: v for k, v in (f.all_facts or {}).items()
                       if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v)},
        )

    def unrec(u: Unrecognised) -> Unrecognised:
        return Unrecognised(exception=s.text(u.exception), line=u.line,
                            user_frame=s.text(u.user_frame) if u.user_frame else u.user_frame,
                            count=u.count, ranks=list(u.ranks))

    out = Report(findings=[finding(f) for f in report.findings], input=s.obj(report.input),
                 unrecognised=[unrec(u) for u in report.unrecognised], extra=s.obj(report.extra))
    out.quiet_rules = set(report.quiet_rules)
    return out


def to_json(report: Report, schema: str | None = None, anonymize: bool = False) -> str:
    import json

    from .redact import Scrubber

    data = clean_report(report, anonymize).to_dict()
    if schema:
        data = {"schema": schema, **data}
    # the last step before the bytes: whatever to_dict composed is scrubbed as a whole
    data = Scrubber(anonymize).obj(data, by_name=False)
    return json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n"


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


_LABEL_MAX = 28  # a label column wider than this would push the text to the right edge


def evidence_lines(evidence: list[Evidence], width: int, indent: int = 4) -> list[tuple[str, str]]:
    """Evidence as (label, text) line pairs, the labels aligned: log lines ("line 14:")
    in one column, numbers right-aligned; snapshot values ("torch.cuda_build:") in
    their own, left-aligned. A label longer than _LABEL_MAX is not padded to: its
    text follows it and wraps under an indent, so one long name never pushes the
    others' text across the terminal. The label part of a continuation line is ""."""
    labels = [_evidence_label(e.line, e.source) for e in evidence]
    numbered = [lab for lab, e in zip(labels, evidence) if e.line is not None]
    named = [lab for lab, e in zip(labels, evidence) if e.line is None and len(lab) <= _LABEL_MAX]
    num_w = max((len(x) for x in numbered), default=0)
    name_w = max((len(x) for x in named), default=0)
    out: list[tuple[str, str]] = []
    pad = " " * indent
    for label, e in zip(labels, evidence):
        if e.line is not None:
            head = f"{pad}{label:>{num_w}}: "
        elif len(label) <= _LABEL_MAX:
            head = f"{pad}{label + ':':<{name_w + 1}} "
        else:
            head = f"{pad}{label}: "
        hang = head if len(head) <= indent + _LABEL_MAX + 2 else pad + "  "
        lines = wrap(e.text, width, first=head, rest=" " * len(hang)) if e.text else [head.rstrip()]
        n = min(len(head), len(lines[0]))
        out.append((lines[0][:n], lines[0][n:]))
        out += [("", line) for line in lines[1:]]
    return out


# --- wrapping that never cuts a URL, a command or a code span ---------------------------

# a unit: a run of non-spaces that may contain whole `code spans` (with their spaces)
_UNIT = _Lazy(r"(?:[^\s`]*`[^`\n]*`)+[^\s`]*|\S+")


def cells(text: str) -> int:
    """Terminal columns `text` takes (CJK characters take two)."""
    if text.isascii():
        return len(text)
    from unicodedata import combining, east_asian_width

    return sum(0 if combining(ch) else 2 if east_asian_width(ch) in "WF" else 1 for ch in text)


def _split_cells(unit: str, width: int) -> list[str]:
    """A long run of wide text (CJK prose has no spaces) cut into pieces of `width`
    columns; only for units with wide characters, never for a URL or a command."""
    pieces, cur, n = [], "", 0
    for ch in unit:
        w = cells(ch)
        if cur and n + w > width:
            pieces.append(cur)
            cur, n = "", 0
        cur += ch
        n += w
    return pieces + [cur] if cur else pieces


def wrap(text: str, width: int, indent: int = 0, first: str = "", rest: str | None = None) -> list[str]:
    """`text` as lines of at most `width` characters, broken at spaces only: a URL, a
    path or a `code span` is never cut (one longer than the line gets a line of its own
    and overflows it, which a terminal soft-wraps and copies whole). `first` prefixes the
    first line, `rest` (default: spaces as wide as `first`) the others, after `indent`."""
    pad = " " * indent
    rest = " " * len(first) if rest is None else rest
    lines: list[str] = []
    prefix = pad + first
    for para in text.split("\n"):
        units = _UNIT.findall(para)
        if not units:
            lines.append(prefix.rstrip())
            prefix = pad + rest
            continue
        cur = prefix
        empty = True
        room = max(10, width - len(pad + rest))
        expanded: list[str] = []
        for u in units:  # wide prose without spaces may break anywhere; code and URLs never
            expanded += _split_cells(u, room) if not u.isascii() and "`" not in u and cells(u) > room else [u]
        for u in expanded:
            if empty:
                if cells(cur) + cells(u) > width and cur.strip() and cur != prefix:
                    lines.append(cur.rstrip())
                    cur = pad + rest
                cur += u
                empty = False
            elif cells(cur) + 1 + cells(u) <= width:
                cur += " " + u
            else:
                lines.append(cur.rstrip())
                cur = pad + rest + u
            prefix = pad + rest
        lines.append(cur.rstrip())
        prefix = pad + rest
    return lines


def _pad(text: str, width: int, right: bool = False) -> str:
    fill = " " * max(0, width - cells(text))
    return fill + text if right else text + fill


def table_lines(cols: list[str], rows: list[list[str]], width: int, *, right: set[str] | frozenset = frozenset(),
                key: int = 0, transpose: bool = False) -> list[str]:
    """The one table layout of every face: a plain table (no box characters, no
    trailing spaces) when it fits in `width`; else, with `transpose` (a few rows of many
    short columns: the probe's modes), one column per row when that fits; otherwise
    stacked: each row's `key` cell on a line, then `  column: value` lines, so that no
    cell is ever truncated."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([cells(c)] + [cells(r[i]) for r in rows]) for i, c in enumerate(cols)]
    if sum(widths) + 2 * (len(cols) - 1) <= width:
        def fmt(line: list[str]) -> str:
            parts = [_pad(cell, w, col in right) for cell, w, col in zip(line, widths, cols)]
            return "  ".join(parts).rstrip()
        return [fmt(cols), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    if transpose and rows:
        names = [c for i, c in enumerate(cols) if i != key]
        flipped = [[r[i] for r in rows] for i in range(len(cols)) if i != key]
        head = [r[key] for r in rows]
        label = max(cells(c) for c in names)
        col_w = [max(cells(head[j]), *(cells(f[j]) for f in flipped)) for j in range(len(rows))]
        if label + sum(col_w) + 2 * len(rows) <= width:
            def line(first: str, values: list[str]) -> str:
                return (_pad(first, label) + "".join("  " + _pad(v, w, True) for v, w in zip(values, col_w))).rstrip()
            return [line("", head), line("", ["-" * w for w in col_w])] + [line(n, f) for n, f in zip(names, flipped)]
    label = max(len(c) for i, c in enumerate(cols) if i != key)
    out: list[str] = []
    for r in rows:
        out.append(r[key])
        for i, (c, cell) in enumerate(zip(cols, r)):
            if i != key:
                out += wrap(cell, width, indent=2, first=f"{c + ':':<{label + 1}} ")
    return out


def markdown_table(cols: list[str], rows: list[list[str]]) -> list[str]:
    """A GitHub markdown table (a `|` inside a cell escaped)."""
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [row(cols), "|" + "---|" * len(cols)] + [row(r) for r in rows]


def sparkline(values: list[float]) -> str:
    """▁▂▃▄▅▆▇█ for a series (the loss scale over steps): log-scaled when it spans
    more than a factor of 100, as loss scales do."""
    import math

    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]
    if not vals:
        return ""
    if min(vals) > 0 and max(vals) / min(vals) > 100:
        vals = [math.log2(v) for v in vals]
    lo, hi = min(vals), max(vals)
    bars = "▁▂▃▄▅▆▇█"
    if hi == lo:
        return bars[3] * len(vals)
    return "".join(bars[min(7, int((v - lo) / (hi - lo) * 8))] for v in vals)


def bar(fraction: float, width: int = 20) -> str:
    """A horizontal bar for a share in [0, 1] (headroom against a dtype's largest value)."""
    f = max(0.0, min(1.0, float(fraction)))
    full = int(f * width)
    return "█" * full + ("▌" if f * width - full >= 0.5 else "") + "·" * (width - full - (1 if f * width - full >= 0.5 else 0))


def _series(f: Finding) -> list[tuple[str, list[float]]]:
    """Numeric series a finding's facts carry (a run rule's `_scale_series`: the loss
    scale over the steps), drawn as a sparkline in the terminal and the markdown."""
    out = []
    facts = dict(f.all_facts or {})
    facts.update(f.facts)
    for k, v in facts.items():
        if isinstance(v, list) and len(v) >= 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            if "scale" in k or k.endswith("_series") or "loss" in k:
                out.append((k.lstrip("_").replace("_", " "), v))
    return out


# --- environment block (markdown) -------------------------------------------------------

def environment_from_snapshot(snap: dict[str, Any]) -> dict[str, str]:
    """mpdoctor, Python, torch, accelerate, GPU, driver from an environment snapshot."""
    from . import __version__

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
    from .redact import Scrubber, markdown_safe

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


# --- terminal -------------------------------------------------------------------------

def _width(console: Any) -> int:
    try:
        width = int(console.width)
    except (TypeError, ValueError, AttributeError):
        return DEFAULT_WIDTH
    return max(40, width) if width > 0 else DEFAULT_WIDTH


def _say(console: Any, *parts: tuple[str, str]) -> None:
    """One line, exactly as given: never wrapped, cropped or padded by rich."""
    from rich.text import Text

    t = Text(no_wrap=True, overflow="ignore", end="\n")
    for text, style in parts:
        t.append(text, style=style or None)
    console.print(t, soft_wrap=True, crop=False)


def print_terminal(report: Report, console: Any, heading: str | None = None, *, anonymize: bool = False,
                   verbose: bool = False) -> None:
    """Plain indented output, one block per finding: header, title, why, evidence with
    line numbers, numbered fixes, references each on its own line."""
    from .redact import scrub

    report = clean_report(report, anonymize)
    heading = scrub(heading, anonymize) if heading else heading
    width = _width(console)
    if heading:
        _say(console, (heading, "bold"))
    if not report.findings:
        for line in wrap(("✓ " if not report.unrecognised else "") + _nothing_found(report), width):
            _say(console, (line, "green" if not report.unrecognised else "yellow"))
    for n, f in enumerate(report.findings):
        if n or heading:
            _say(console)
        count = f" ×{f.count}" if f.count > 1 else ""
        ranks = f" (ranks {', '.join(map(str, f.ranks))})" if f.ranks else ""
        _say(console, (f"{SYMBOL[f.severity]} {f.severity}{count}{ranks}", STYLE[f.severity]),
             (f" · {f.category} · {f.rule}", "dim"))
        for line in wrap(f.title, width, indent=2):
            _say(console, (line, "bold"))
        if f.explanation:
            for line in wrap(f.explanation, width, indent=2):
                _say(console, (line, ""))
        for name, series in _series(f):
            _say(console, (f"  {name}: ", "dim"), (sparkline(series), "cyan"),
                 (f"  {_num(series[0])} → {_num(series[-1])}", "dim"))
        if f.evidence:
            _say(console, ("  Evidence", "bold"))
            for head, rest in evidence_lines(f.evidence, width):
                _say(console, (head, "dim"), (rest, ""))
        if f.fixes:
            _say(console, ("  Fix", "bold"))
            for i, fix in enumerate(f.fixes, 1):
                lines = wrap(fix, width, indent=4, first=f"{i}. ")
                _say(console, (lines[0][:4 + len(f'{i}. ')], "bold"), (lines[0][4 + len(f'{i}. '):], ""))
                for line in lines[1:]:
                    _say(console, (line, ""))
        if f.references:
            _say(console, ("  See", "bold"))
            for r in f.references:
                _say(console, ("    " + r, ""))
        facts = _facts_line(f)
        if facts and verbose:
            for line in wrap("facts: " + facts, width, indent=2):
                _say(console, (line, "dim"))
    if report.unrecognised and report.findings:
        _say(console)
    for u in report.unrecognised:
        lead = f"? not recognised, line {u.line}: "
        lines = wrap(u.exception + _unrecognised_tail(u), width, first=lead, rest="  ")
        _say(console, (lead[:18], "yellow"), (lead[18:], "dim"), (lines[0][len(lead):], ""))
        for line in lines[1:]:
            _say(console, (line, ""))
    if report.findings:
        _say(console)
        _say(console, (_summary(report), "bold"))


def _summary(report: Report) -> str:
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    infos = sum(f.severity == "info" for f in report.findings)
    return f"{len(report.findings)} finding(s): {errors} error, {warnings} warning, {infos} info"


def to_oneline(report: Report, where: str = "", *, anonymize: bool = False) -> str:
    """One line per finding, `WHERE:LINE: severity [rule] category: title`, the shape of
    compilers and linters (gcc, ruff --output-format concise) for CI logs and editors."""
    from .redact import scrub

    report = clean_report(report, anonymize)
    where = scrub(where, anonymize)
    out = []
    for f in report.findings:
        # the line the finding was matched on (an exception's own line), not the
        # earliest line it cites (often the user's frame above it)
        first = next((e.line for e in f.evidence if e.line is not None), 0)
        loc = f"{where}:{first}" if first else (where or "mpdoctor")
        count = f" (×{f.count})" if f.count > 1 else ""
        out.append(f"{loc}: {f.severity} [{f.rule}] {f.category}: {' '.join(f.title.split())}{count}")
    for u in report.unrecognised:
        loc = f"{where}:{u.line}" if u.line else (where or "mpdoctor")
        out.append(f"{loc}: unrecognised {' '.join(u.exception.split())}{_unrecognised_tail(u)}")
    out.append(_summary(report) if report.findings else "no finding")
    return scrub("\n".join(out), anonymize) + "\n"


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


class _ScrubbingFile:
    """The console's file: every write scrubbed once more (a safety net under the
    renderers' own scrubbing, for text a face prints through rich directly)."""

    def __init__(self, stream: Any, anonymize: bool = False):
        from .redact import Scrubber

        self._stream = stream
        self._scrub = Scrubber(anonymize).text

    def write(self, text: str) -> int:
        # the last step: secrets cut again, and no control character but rich's colours
        return self._stream.write(self._scrub(text, controls=False))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding ...
        return getattr(self._stream, name)


_PAD = _Lazy(r"[ \t]+((?:\x1b\[[0-9;]*m)*)$")


def print_unpadded(console: Any, renderable: Any) -> None:
    """Print a rich renderable (a Markdown page, a Table) without the spaces rich pads
    every line with to the full width."""
    with console.capture() as cap:
        console.print(renderable)
    text = "\n".join(_PAD.sub(r"\1", line) for line in cap.get().split("\n"))
    console.file.write(text)
    console.file.flush()


DEFAULT_WIDTH = 80


def terminal_columns(stream: Any = None) -> int:
    """The width to lay out for: COLUMNS when it is a positive number, else the
    terminal's own width when `stream` is one, else 80 (COLUMNS=0, a negative or a
    garbled value, a pipe, a terminal that reports 0 columns)."""
    import os

    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        if stream is not None and stream.isatty():
            columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns if columns > 0 else DEFAULT_WIDTH


def make_console(stderr: bool = False, anonymize: bool = False) -> Any:
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # the width given, not read by rich (which takes COLUMNS=0 at its word: no output)
    console = Console(file=_ScrubbingFile(stream, anonymize), highlight=False, soft_wrap=False,
                      width=terminal_columns(stream))
    console.on_broken_pipe = _broken_pipe  # rich would exit 1 ("error found"); commands.guarded says 0
    return console


def _broken_pipe() -> None:
    raise BrokenPipeError("the reader of the output went away")


def emit(report: Report, fmt: str, *, stderr: bool = False, heading: str = "mpdoctor", anonymize: bool = False,
         verbose: bool = False, schema: str | None = None, where: str = "",
         environment: dict[str, str] | None = None) -> None:
    """Write the report in `fmt` to stdout (or stderr, for `run`): the one way out for
    explain and run, scrubbed of secrets (and anonymized with `anonymize`)."""
    import sys

    stream = sys.stderr if stderr else sys.stdout
    stream.write(render_text(report, fmt, heading=heading, anonymize=anonymize, verbose=verbose,
                             schema=schema, where=where, environment=environment, stderr=stderr)
                 if fmt != "terminal" else "")
    if fmt == "terminal":
        print_terminal(report, make_console(stderr=stderr, anonymize=anonymize), heading=None,
                       anonymize=anonymize, verbose=verbose)
    stream.flush()


def render_text(report: Report, fmt: str, *, heading: str = "mpdoctor", anonymize: bool = False,
                verbose: bool = False, schema: str | None = None, where: str = "",
                environment: dict[str, str] | None = None, stderr: bool = False, width: int | None = None) -> str:
    """The report as a string in `fmt` (what `--report FILE` writes): json, markdown,
    oneline, or the terminal layout without colours."""
    if fmt == "json":
        return to_json(report, schema=schema, anonymize=anonymize)
    if fmt == "markdown":
        return to_markdown(report, heading, anonymize=anonymize, verbose=verbose, environment=environment)
    if fmt == "oneline":
        return to_oneline(report, where, anonymize=anonymize)
    import io

    from rich.console import Console

    from .redact import scrub

    buf = io.StringIO()
    width = width if isinstance(width, int) and width > 0 else DEFAULT_WIDTH
    console = Console(file=buf, width=width, no_color=True, highlight=False, color_system=None)
    print_terminal(report, console, heading=None, anonymize=anonymize, verbose=verbose)
    return scrub(buf.getvalue(), anonymize)


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
    from .redact import scrub

    report = clean_report(report, anonymize)
    heading = scrub(heading, anonymize)
    width = _width(console)

    def line(indent: int, text: str, style: str = "", lead: str = "", lead_style: str = "", hang: int = 0) -> None:
        lines = wrap(text, width, indent=indent, first=lead, rest=" " * (len(lead) + hang))
        head = indent + len(lead)
        _say(console, (lines[0][:head], lead_style), (lines[0][head:], style))
        for extra in lines[1:]:
            _say(console, (extra, style))

    c = report.extra.get("checklist", {})
    _say(console, (heading, "bold"))
    for text in c.get("environment", []):
        line(2, text, "dim", hang=2)
    _say(console, ("Precision plan", "bold"))
    for text in c.get("plan", []):
        line(2, text, hang=2)
    for m in c.get("modes", []):
        line(2, _mode_text(m), "", CHECK_SYMBOL.get(m["status"], "?") + " ", CHECK_STYLE.get(m["status"], ""))
    _say(console, ("Checklist", "bold"))
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
        _say(console, ("fp8 backends", "bold"))
        rows = [list(r) for r in _fp8_rows(c["fp8"])]
        for text in table_lines(["backend", "installed", "verdict"], rows, width - 2):
            _say(console, ("  " + text if text else "", ""))
    probe = report.extra.get("probe") or {}
    if probe.get("lines"):
        _say(console, ("Probe", "bold"))
        table = probe.get("table") or {}
        if table.get("columns") and table.get("rows"):
            body = table_lines(table["columns"], table["rows"], width - 2, transpose=True)
            footer = probe.get("footer") or []
        else:  # a probe that did not run: its lines say why
            body, footer = [], probe["lines"]
        for text in body:
            _say(console, ("  " + text if text else "", ""))
        for text in footer:
            stripped = text.lstrip()
            line(2 + len(text) - len(stripped), stripped, hang=2)
    skipped = c.get("skipped", [])
    if skipped:
        _say(console, (f"Skipped ({len(skipped)}): not judged here, neither passed nor failed", "bold"))
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
    from .redact import markdown_safe, scrub

    report = clean_report(report, anonymize)
    heading = scrub(heading, anonymize)
    from . import __version__

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
        print_checklist(report, make_console(anonymize=anonymize), heading, anonymize=anonymize, verbose=verbose)
    sys.stdout.flush()
