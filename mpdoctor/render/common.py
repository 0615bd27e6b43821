"""What every renderer shares: the scrubbed copy of a report (redaction is the last
step of every writer), JSON, a finding's facts and evidence lines, the words for nothing
found."""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    from typing import Any

from ..findings import Evidence, Finding, Report, Unrecognised
from .text import wrap

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
    from ..redact import Scrubber

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

    from ..redact import Scrubber

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
