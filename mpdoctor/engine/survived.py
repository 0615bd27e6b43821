"""Severity from context: a condition the log shows was survived is information, not an error.

One general judgement over what follows a finding in the log, for every rule alike (no rule
carries an exception for it): a finding that rests on no traceback (a logged warning, a
`grad_norm: nan` window, a fallback notice), after whose last evidence line the same run
logs at least SURVIVED_AFTER progress lines with a finite loss and no traceback begins, was
survived: training went on. Its severity is lowered to "info" and the [survived] frame of
rules/_frames.toml says why, in words a rule file holds.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..findings import Finding
    from ..logtext import LogLine, Traceback

from ..logtext import LazyRe

SURVIVED_AFTER = 3
# a progress line with a finite loss: a dict or key=value log ("'loss': 1.23", "loss=1.2e-1",
# Lightning's "train_loss=2.31", mmdet's "loss_cls: 1.53", a loop's "Loss: 2.31"; never the
# loss scale), or a bare "<step> ... <number>" row
_PROGRESS = LazyRe(
    r"""(?:(?<![A-Za-z])[Ll]oss(?:_(?!scale)\w{1,20})?['"]?\s?[=:]\s?['"]?-?\d{1,9}(?:\.\d{1,12})?(?:[eE][-+]?\d{1,3})?\b(?![\w.]))"""
    r"""|(?:^\s{0,8}\d{1,9}(?:[\s,;|]{1,6}-?\d{1,9}(?:\.\d{1,12})?(?:[eE][-+]?\d{1,3})?){0,3}"""
    r"""[\s,;|]{1,6}-?\d{1,6}\.\d{1,12}(?:[eE][-+]?\d{1,3})?\s{0,8}$)""")
_NONFINITE = LazyRe(r"""\b(?:nan|NaN|inf|Infinity)\b""")


def lower_survived(findings: list[Finding], lines: list[LogLine], tracebacks: list[Traceback]) -> list[Finding]:
    """`findings` with the survived ones lowered to info (in place; the list is returned)."""
    candidates = [f for f in findings if f.severity in ("error", "warning") and not f.consequence
                  and f.evidence and all(e.line for e in f.evidence)]
    if not candidates:
        return findings
    spans = [(t.start, t.end) for t in tracebacks]
    last_tb = max((t.start for t in tracebacks), default=0)
    for f in candidates:
        last = max(e.line for e in f.evidence)
        if any(a <= e.line <= b for e in f.evidence for a, b in spans):
            continue  # an exception: not survived by definition
        if last_tb > last:
            continue  # a traceback follows: the run did not go on unharmed
        if _progress_after(lines, last) < SURVIVED_AFTER:
            continue
        _lower(f)
    return findings


def _progress_after(lines: list[LogLine], after: int) -> int:
    import bisect

    n = 0
    for ln in lines[bisect.bisect_right(lines, after, key=lambda x: x.no):]:
        text = ln.text
        if _PROGRESS.search(text) and not _NONFINITE.search(text):
            n += 1
            if n >= SURVIVED_AFTER:
                break
    return n


def _lower(f: Finding) -> None:
    from .frames import frame
    from .template import render

    words = frame("survived")
    f.severity = words.get("severity", "info")
    said = render(words["explanation"], {"after": str(SURVIVED_AFTER)})
    if said:
        f.explanation = " ".join(x for x in (said, f.explanation) if x)
