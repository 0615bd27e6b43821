"""The one findings model every face of mpdoctor ends in.

Plain data that serialises to the stable JSON contract. Nothing here imports torch,
accelerate or rich, and no dataclasses: creating a dataclass costs about a millisecond
at import (and `dataclasses` pulls in `inspect`), and `mpdoctor explain` must start like
a small script. The classes behave as the dataclasses they were: keyword or positional
construction in field order, `==` over the compared fields (same class only), a
`Name(field=value, ...)` repr, unhashable; `Finding.__init__` ends in `__post_init__`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at run time (a few ms of the start)
if TYPE_CHECKING:
    from typing import Any


class _Record:
    """`==` and repr of a dataclass over the names in `_COMPARE` / `_REPR`."""

    _COMPARE: tuple[str, ...] = ()
    _REPR: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(getattr(self, k) for k in self._COMPARE) == tuple(getattr(other, k) for k in other._COMPARE)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value: as a dataclass

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._REPR)})"


# The category contract (docs/categories.md). Order is the table's order.
CATEGORIES: tuple[str, ...] = (
    "bf16-unsupported",
    "fp16-unsupported-device",
    "fp8-unsupported",
    "half-op-not-implemented",
    "flash-attention-unsupported",
    "no-kernel-image",
    "driver-too-old",
    "cuda-unavailable",
    "cuda-library-missing",
    "version-incompatible",
    "dtype-mismatch",
    "device-mismatch",
    "fp16-gradient-unscale",
    "fp16-value-overflow",
    "autocast-unsafe-op",
    "non-finite-values",
    "loss-scale-overflow",
    "out-of-memory",
    "host-out-of-memory",
    "distributed-communication",
    "accelerate-config",
    "cuda-kernel-fault",
    "cublas-cudnn-failure",
    "amp-deprecated-api",
)

SEVERITIES: tuple[str, ...] = ("error", "warning", "info")
SEVERITY_ORDER = {name: i for i, name in enumerate(SEVERITIES)}


class Evidence(_Record):
    """One line or value a finding rests on.

    `line` is the 1-based line number in the input (None for values read from an
    environment snapshot); `source` says where the text came from: "log", or the
    snapshot field path such as "torch.devices[0].capability".
    """

    _COMPARE = _REPR = ("text", "line", "source")

    def __init__(self, text: str, line: int | None = None, source: str = "log") -> None:
        self.text = text
        self.line = line
        self.source = source

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "text": self.text, "source": self.source}


class Finding(_Record):
    """A rule's finding. `count`: how many times the same finding was seen (the same
    traceback on 8 ranks). `consequence`: a ChildFailedError, a rank killed because
    another died; it ranks below the causes of the same severity. `all_facts`: the
    facts with the `_helper` ones, as the templates saw them (engine.assemble keeps them
    so that a merge can re-render); never serialised, compared or shown in the repr."""

    _COMPARE = _REPR = ("rule", "category", "severity", "title", "explanation", "fixes", "evidence", "facts",
                        "references", "count", "ranks", "consequence", "priority", "likely")

    def __init__(self, rule: str, category: str, severity: str, title: str, explanation: str = "",
                 fixes: list[str] | None = None, evidence: list[Evidence] | None = None,
                 facts: dict[str, Any] | None = None, references: list[str] | None = None, count: int = 1,
                 ranks: list[int] | None = None, consequence: bool = False, priority: int = 50,
                 all_facts: dict[str, Any] | None = None, likely: bool = False,
                 refinements: list[tuple[str, Any, Any, dict[str, Any]]] | None = None) -> None:
        self.rule = rule
        self.category = category
        self.severity = severity
        self.title = title
        self.explanation = explanation
        self.fixes = [] if fixes is None else fixes
        self.evidence = [] if evidence is None else evidence
        self.facts = {} if facts is None else facts
        self.references = [] if references is None else references
        self.count = count
        self.ranks = [] if ranks is None else ranks
        self.consequence = consequence
        self.priority = priority
        self.all_facts = all_facts
        # a likely match (engine.likely): the assembler frames its words as a guess, and a
        # merge keeps that frame unless a certain sighting of the same cause joins it
        self.likely = likely
        # other rules' sentences that refine this finding (a machine's facts under a log
        # finding): (words position, fixes position, rule or frame, facts), re-rendered
        # with it by the assembler
        self.refinements = [] if refinements is None else refinements
        self.__post_init__()  # tests/conftest.py wraps it to record every rule id made

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown category {self.category!r} (see categories.md)")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def replace(self, **changes: Any) -> Finding:
        """A copy with `changes`, as dataclasses.replace made it (the renderers' scrubbed
        copy): the same finding, not a new one."""
        kw = {k: getattr(self, k) for k in self._COMPARE}
        kw["all_facts"] = self.all_facts
        kw["refinements"] = list(self.refinements)
        kw.update(changes)
        return type(self)(**kw)

    @property
    def first_line(self) -> int:
        lines = [e.line for e in self.evidence if e.line is not None]
        return min(lines) if lines else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "category": self.category,
            "severity": self.severity,
            "title": self.title,
            "explanation": self.explanation,
            "fixes": list(self.fixes),
            "evidence": [e.to_dict() for e in self.evidence],
            "facts": dict(self.facts),
            "references": list(self.references),
            "count": self.count,
            "ranks": list(self.ranks),
            "consequence": self.consequence,
            "likely": self.likely,
        }


class Unrecognised(_Record):
    """An exception no rule knows: reported with its line and the user frame; `ranks`
    the ranks it was seen on."""

    _COMPARE = _REPR = ("exception", "line", "user_frame", "count", "ranks")

    def __init__(self, exception: str, line: int, user_frame: str | None = None, count: int = 1,
                 ranks: list[int] | None = None) -> None:
        self.exception = exception
        self.line = line
        self.user_frame = user_frame
        self.count = count
        self.ranks = [] if ranks is None else ranks

    def to_dict(self) -> dict[str, Any]:
        # as dataclasses.asdict made it: the fields in order, the list copied
        return {"exception": self.exception, "line": self.line, "user_frame": self.user_frame,
                "count": self.count, "ranks": list(self.ranks)}


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Root cause first: severity, then causes before consequences, then priority,
    then where it appears first in the log."""
    return sorted(
        findings,
        key=lambda f: (SEVERITY_ORDER[f.severity], f.consequence, -f.priority, f.first_line),
    )


def has_error(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


class Report(_Record):
    """What a face hands to the renderers. `extra`: top-level keys a face adds to its
    JSON (check's checklist, run's exit code). `quiet_rules`: rules whose findings alone
    are no reason to speak after a run that went well (summaries, notes about mpdoctor
    itself); not serialised, compared or shown in the repr."""

    _COMPARE = _REPR = ("findings", "input", "unrecognised", "extra")

    def __init__(self, findings: list[Finding], input: dict[str, Any] | None = None,
                 unrecognised: list[Unrecognised] | None = None, extra: dict[str, Any] | None = None,
                 quiet_rules: set[str] | None = None) -> None:
        self.findings = findings
        self.input = {} if input is None else input
        self.unrecognised = [] if unrecognised is None else unrecognised
        self.extra = {} if extra is None else extra
        self.quiet_rules = set() if quiet_rules is None else quiet_rules

    @property
    def has_error(self) -> bool:
        return has_error(self.findings)

    def worth_showing(self, exit_code: int = 0) -> bool:
        """Whether a face that stays quiet when all is well (run) has something to say."""
        return exit_code != 0 or any(f.rule not in self.quiet_rules for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out["findings"] = [f.to_dict() for f in self.findings]
        out["input"] = dict(self.input)
        out["unrecognised"] = [u.to_dict() for u in self.unrecognised]
        return out
