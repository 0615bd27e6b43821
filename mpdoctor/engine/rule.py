"""A rule as data: the model the loader builds from one TOML file.

Four kinds share it: log rules (patterns over log text), and env, run and probe rules
(a named check judged over JSON evidence: an environment snapshot, a wrapped run's
recorded events, the probe's measurements). The TOML format is documented in
rules/README.md; rule files are read and validated by engine.loader.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

from .fixedruns import runs_in_order

RULE_KINDS = ("log", "env", "run", "probe", "job")
# the evidence key an example of each kind names (an env rule may also be judged on a
# run's events or a probe's measurements: the same knowledge, seen by another face)
EVIDENCE_KEYS = ("snapshot", "events", "probe")


class RuleError(Exception):
    """A rule file that cannot be used. str() says file, rule and problem."""

    def __init__(self, path: Path | str, rule_id: str | None, problem: str):
        self.path = str(path)
        self.rule_id = rule_id
        self.problem = problem
        where = f"{self.path}" + (f" (rule {rule_id!r})" if rule_id else "")
        super().__init__(f"{where}: {problem}")


class LazyPattern:
    """A rule's regular expression, compiled the first time it is used.

    A rule base of a hundred rules has a few hundred patterns; compiling them all costs
    more than the rest of `mpdoctor explain` on a short traceback, and a log touches
    only the few whose literal it contains. Behaves like the `re.Pattern` it wraps.
    """

    __slots__ = ("pattern", "_rx", "_rx_folded", "runs", "caseless", "_runs_low")

    def __init__(self, pattern: str, runs=(), caseless: bool = False):
        self.pattern = pattern
        self._rx: re.Pattern[str] | None = None
        self._rx_folded: re.Pattern[str] | None = None
        self._runs_low: tuple | None = None
        # Literal runs every match contains, in order (lower-cased when caseless): a line
        # without them is skipped before the pattern is compiled or run.
        self.runs = runs if type(runs) is tuple else tuple(
            tuple(step) if not isinstance(step, str) else (step,) for step in runs)
        self.caseless = caseless

    def may_match(self, text: str, low: str | None = None) -> bool:
        if not self.runs:
            return True
        t = (low if low is not None else text.lower()) if self.caseless else text
        return runs_in_order(t, self.runs)

    @property
    def compiled(self) -> re.Pattern[str]:
        if self._rx is None:
            self._rx = re.compile(self.pattern)
        return self._rx

    def may_match_folded(self, low: str) -> bool:
        """may_match for the case-folded second chance (`low` is the lower-cased text)."""
        if not self.runs:
            return True
        if self._runs_low is None:
            self._runs_low = tuple(tuple(a.lower() for a in step) for step in self.runs)
        return runs_in_order(low, self._runs_low)

    def search_folded(self, string: str) -> re.Match[str] | None:
        """The pattern case-insensitively: a message retyped in other capitals
        ("current loss scale already at minimum")."""
        if self._rx_folded is None:
            self._rx_folded = re.compile(self.pattern, re.IGNORECASE)
        return self._rx_folded.search(string)

    def search(self, string: str, *args: int) -> re.Match[str] | None:
        return self.compiled.search(string, *args)

    def match(self, string: str, *args: int) -> re.Match[str] | None:
        return self.compiled.match(string, *args)

    def finditer(self, string: str, *args: int):
        return self.compiled.finditer(string, *args)

    def __getattr__(self, name: str) -> Any:  # groupindex, flags, fullmatch, ...
        return getattr(self.compiled, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyPattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"LazyPattern({self.pattern!r})"


class Example:
    """A rule's own test case: log text or a log file (log rules), or a recorded evidence
    file: an environment snapshot, a run's events, a probe's measurements."""

    __slots__ = ("text", "file", "snapshot", "events", "probe", "facts", "note")

    def __init__(self, text: str | None = None, file: str | None = None, snapshot: str | None = None,
                 facts: dict[str, Any] | None = None, note: str = "", events: str | None = None,
                 probe: str | None = None):
        self.text = text
        self.file = file
        self.snapshot = snapshot
        self.events = events
        self.probe = probe
        self.facts = facts if facts is not None else {}
        self.note = note

    @property
    def evidence(self) -> tuple[str, str] | None:
        """(kind of evidence, its file) for an evidence example; None for log text."""
        for key in ("snapshot", "events", "probe"):
            value = getattr(self, key)
            if value:
                return key, value
        return None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) not in (None, "", {})}

    def __repr__(self) -> str:
        return "Example(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Example) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)


_RULE_FIELDS = (
    "id", "kind", "category", "severity", "title", "titles", "path", "summary", "priority", "consequence", "patterns",
    "unless", "requires", "excludes", "context", "frames_after", "literals", "min_count", "supersedes", "derive", "derive_module",
    "check", "explanation", "fixes", "references", "versions", "doc", "examples", "near_misses", "unrendered",
    "quiet", "words", "each", "area", "only_in_trouble", "refines", "position", "fix_position", "fix_when_alone",
)


class Rule:
    """One rule (a TOML file). A plain class, not a dataclass (creating one costs about a
    millisecond at import, and `explain` must start like a small script); `path` is a
    pathlib.Path made on first use, for the same reason (pathlib imports urllib)."""

    def __init__(self, id: str, kind: str, category: str, severity: str, title: str, path: "Path | str",
                 summary: str = "", priority: int = 50, consequence: bool = False,
                 patterns: list[LazyPattern] | None = None, unless: list[LazyPattern] | None = None,
                 requires: list[LazyPattern] | None = None, excludes: list[LazyPattern] | None = None,
                 context: list[LazyPattern] | None = None, frames_after: list[LazyPattern] | None = None,
                 literals: list[str] | None = None, min_count: int = 1,
                 supersedes: list[str] | None = None, derive: str | None = None, derive_module: str | None = None,
                 check: str | None = None, explanation: list[str] | None = None, fixes: list[str] | None = None,
                 references: list[str] | None = None, versions: str = "", doc: dict[str, str] | None = None,
                 examples: list[Example] | None = None, near_misses: list[Example] | None = None,
                 titles: list[str] | None = None, unrendered: dict[str, str] | None = None,
                 quiet: bool = False, words: dict[str, dict[str, str]] | None = None,
                 each: dict[str, str] | None = None, area: str | None = None, only_in_trouble: bool = False,
                 refines: list[str] | None = None, position: str = "last", fix_position: str = "last",
                 fix_when_alone: bool = False):
        self.id = id
        self.kind = kind
        self.category = category
        self.severity = severity
        self.title = title  # the first (fullest) title: what listings and rule pages show
        # `title` may be a list in TOML: the first whose facts are all known is used
        self.titles = titles or [title]
        self.path = path  # type: ignore[assignment]
        self.summary = summary
        self.priority = priority
        self.consequence = consequence
        # a quiet finding (a summary, a note about mpdoctor itself) is reported, but is
        # not on its own a reason for `mpdoctor run` to speak after a run that went well
        self.quiet = quiet
        # shown only when the run is in trouble (failed, or another finding speaks): a
        # summary that is no news after a run that went well
        self.only_in_trouble = only_in_trouble
        # a refinement (diagnosis.sharpen): the machine's facts under a log finding of these
        # categories; its sentences go first or last, its fixes too (fix_position), and
        # only when no machine error finding explains the log already (fix_when_alone)
        self.refines = refines or []
        self.position = position
        self.fix_position = fix_position
        self.fix_when_alone = fix_when_alone
        # the area of `check`'s checklist an env rule belongs to, where its category alone
        # would mislead (a torch that does not import is about torch, not about a library)
        self.area = area
        self.patterns = patterns or []
        self.unless = unless or []
        self.requires = requires or []
        self.excludes = excludes or []
        self.context = context or []
        # a stack a library printed after a line of its own (anomaly mode's "Traceback of
        # forward call that caused the error:"): its last user frame is `stack_frame`
        self.frames_after = frames_after or []
        self.literals = literals or []
        self.min_count = min_count
        self.supersedes = supersedes or []
        self.derive = derive
        self.derive_module = derive_module  # where `derive` lives (so only it is imported)
        self.check = check
        self.explanation = explanation or []
        self.fixes = fixes or []
        self.references = references or []
        self.versions = versions
        self._docs: Any = None  # a loader for doc/examples/near_misses (the rule cache)
        self.doc = doc or {}
        self.examples = examples or []
        self.near_misses = near_misses or []
        # sentences no example renders, and why ({"fixes.3": "needs a Windows snapshot"})
        self.unrendered = unrendered or {}
        # [words.FACT]: what the rule says for each code a fact may hold; [each]: how it
        # says each record of a fact that is a list (engine.assemble.apply_words)
        self.words = words or {}
        self.each = each or {}

    # doc, examples and near misses are not needed to explain a log: from the rule cache
    # they are read (a separate file) the first time one of them is asked for.
    def _load_docs(self) -> None:
        loader, self._docs = self._docs, None
        if loader is not None:
            data = loader() or {}
            self._doc = {k: str(v).strip() for k, v in dict(data.get("doc", {})).items()}
            self._examples = cached_examples(data, "example")
            self._near_misses = cached_examples(data, "near_miss")
            self._unrendered = {str(k): str(v) for k, v in dict(data.get("unrendered", {})).items()}
            for key in ("explanation", "fixes", "references"):
                v = data.get(key, [])
                setattr(self, "_" + key, [v.strip()] if isinstance(v, str) else [x.strip() for x in v if x.strip()])
            self._summary = str(data.get("summary", "")).strip()
            self._versions = str(data.get("versions", ""))
            self._words = {str(k): {str(c): _templates(w) for c, w in dict(v).items()}
                           for k, v in dict(data.get("words", {})).items()}
            self._each = {str(k): _templates(v) for k, v in dict(data.get("each", {})).items()}

    def _lazy(name: str):  # type: ignore[misc]  # noqa: N805 - a property factory
        def get(self):
            self._load_docs()
            return getattr(self, "_" + name)

        def put(self, value) -> None:
            setattr(self, "_" + name, value)

        return property(get, put)

    explanation = _lazy("explanation")
    fixes = _lazy("fixes")
    references = _lazy("references")
    summary = _lazy("summary")
    versions = _lazy("versions")
    words = _lazy("words")
    each = _lazy("each")
    del _lazy

    @property
    def doc(self) -> dict[str, str]:
        self._load_docs()
        return self._doc

    @doc.setter
    def doc(self, value: dict[str, str]) -> None:
        self._doc = value

    @property
    def examples(self) -> list[Example]:
        self._load_docs()
        return self._examples

    @examples.setter
    def examples(self, value: list[Example]) -> None:
        self._examples = value

    @property
    def near_misses(self) -> list[Example]:
        self._load_docs()
        return self._near_misses

    @near_misses.setter
    def near_misses(self, value: list[Example]) -> None:
        self._near_misses = value

    @property
    def unrendered(self) -> dict[str, str]:
        self._load_docs()
        return self._unrendered

    @unrendered.setter
    def unrendered(self, value: dict[str, str]) -> None:
        self._unrendered = value

    @property
    def path(self) -> "Path":
        p = self._path
        if not hasattr(p, "parent"):
            from pathlib import Path

            p = self._path = Path(p)
        return p

    @path.setter
    def path(self, value: "Path | str") -> None:
        self._path = value

    def __repr__(self) -> str:
        return f"Rule(id={self.id!r}, kind={self.kind!r}, category={self.category!r}, path={str(self._path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rule) and all(getattr(self, k) == getattr(other, k) for k in _RULE_FIELDS)

    __hash__ = object.__hash__

    @property
    def root(self) -> "Path":
        """The rules folder this rule came from (examples' `file` paths are relative
        to the project root, which is the folder above it)."""
        p = self.path.parent
        while p.name and p.name not in ("rules", "builtin_rules") and p.parent != p:
            p = p.parent
        return p


def _templates(value: Any) -> "str | list[str]":
    """A template, or a list of them (the first whose facts are known), as TOML gave it."""
    return [str(x) for x in value] if isinstance(value, list) else str(value)


def cached_examples(data: dict, key: str) -> list[Example]:
    """Examples of a file already validated once (the rule cache): no checks again."""
    return [Example(d.get("text"), d.get("file"), d.get("snapshot"), dict(d.get("facts", {})), d.get("note", ""),
                    d.get("events"), d.get("probe"))
            for d in data.get(key, [])]
