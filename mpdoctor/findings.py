"""The one findings model every face of mpdoctor ends in.

Plain data: dataclasses that serialise to the stable JSON contract. Nothing here
imports torch, accelerate or rich.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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


@dataclass
class Evidence:
    """One line or value a finding rests on.

    `line` is the 1-based line number in the input (None for values read from an
    environment snapshot); `source` says where the text came from: "log", or the
    snapshot field path such as "torch.devices[0].capability".
    """

    text: str
    line: int | None = None
    source: str = "log"

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "text": self.text, "source": self.source}


@dataclass
class Finding:
    rule: str
    category: str
    severity: str
    title: str
    explanation: str = ""
    fixes: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    references: list[str] = field(default_factory=list)
    # How many times the same finding was seen (e.g. the same traceback on 8 ranks).
    count: int = 1
    ranks: list[int] = field(default_factory=list)
    # A consequence (ChildFailedError, a rank killed because another died) ranks
    # below the causes of the same severity.
    consequence: bool = False
    priority: int = 50
    # the facts with the `_helper` ones, as the templates saw them (engine.assemble keeps
    # them so that a merge can re-render); never serialised
    all_facts: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown category {self.category!r} (see categories.md)")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        return cls(
            rule=data["rule"],
            category=data["category"],
            severity=data["severity"],
            title=data["title"],
            explanation=data.get("explanation", ""),
            fixes=list(data.get("fixes", [])),
            evidence=[Evidence(**e) for e in data.get("evidence", [])],
            facts=dict(data.get("facts", {})),
            references=list(data.get("references", [])),
            count=int(data.get("count", 1)),
            ranks=list(data.get("ranks", [])),
            consequence=bool(data.get("consequence", False)),
        )


@dataclass
class Unrecognised:
    """An exception no rule knows: reported with its line and the user frame."""

    exception: str
    line: int
    user_frame: str | None = None
    count: int = 1
    ranks: list[int] = field(default_factory=list)  # the ranks it was seen on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Root cause first: severity, then causes before consequences, then priority,
    then where it appears first in the log."""
    return sorted(
        findings,
        key=lambda f: (SEVERITY_ORDER[f.severity], f.consequence, -f.priority, f.first_line),
    )


def has_error(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


@dataclass
class Report:
    """What a face hands to the renderers."""

    findings: list[Finding]
    input: dict[str, Any] = field(default_factory=dict)
    unrecognised: list[Unrecognised] = field(default_factory=list)
    # Extra top-level keys a face adds to its JSON (check's checklist, run's exit code).
    extra: dict[str, Any] = field(default_factory=dict)
    # rules whose findings alone are no reason to speak after a run that went well
    # (summaries, notes about mpdoctor itself); not serialised
    quiet_rules: set[str] = field(default_factory=set, repr=False, compare=False)

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
