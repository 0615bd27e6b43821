"""Rules as data: the TOML format, loading and validation.

One rule per file under `rules/` (log rules in `rules/log/<category>/`, environment
rules in `rules/env/`). The format is documented in rules/README.md; a malformed file
gets a `RuleError` naming the file, the rule and what is wrong.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from ..findings import CATEGORIES, SEVERITIES
from .patterns import PatternError, check_bounded, required_literals

RULE_KINDS = ("log", "env")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*[a-z0-9]$")

_KNOWN_KEYS = {
    "id", "kind", "category", "severity", "title", "priority", "consequence",
    "patterns", "unless", "requires", "excludes", "context", "min_count", "derive",
    "check", "explanation", "fixes", "references", "versions", "doc", "example",
    "near_miss", "summary", "supersedes",
}


class RuleError(Exception):
    """A rule file that cannot be used. str() says file, rule and problem."""

    def __init__(self, path: Path | str, rule_id: str | None, problem: str):
        self.path = str(path)
        self.rule_id = rule_id
        self.problem = problem
        where = f"{self.path}" + (f" (rule {rule_id!r})" if rule_id else "")
        super().__init__(f"{where}: {problem}")


@dataclass
class Example:
    """A rule's own test case: text, a file under fixtures/, or (env rules) a snapshot."""

    text: str | None = None
    file: str | None = None
    snapshot: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class Rule:
    id: str
    kind: str
    category: str
    severity: str
    title: str
    path: Path
    summary: str = ""
    priority: int = 50
    consequence: bool = False
    patterns: list[re.Pattern[str]] = field(default_factory=list)
    unless: list[re.Pattern[str]] = field(default_factory=list)
    requires: list[re.Pattern[str]] = field(default_factory=list)
    excludes: list[re.Pattern[str]] = field(default_factory=list)
    context: list[re.Pattern[str]] = field(default_factory=list)
    literals: list[str] = field(default_factory=list)
    min_count: int = 1
    supersedes: list[str] = field(default_factory=list)
    derive: str | None = None
    check: str | None = None
    explanation: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    versions: str = ""
    doc: dict[str, str] = field(default_factory=dict)
    examples: list[Example] = field(default_factory=list)
    near_misses: list[Example] = field(default_factory=list)

    @property
    def root(self) -> Path:
        """The rules folder this rule came from (examples' `file` paths are relative
        to the project root, which is the folder above it)."""
        p = self.path.parent
        while p.name and p.name not in ("rules", "builtin_rules") and p.parent != p:
            p = p.parent
        return p


def _compile(path: Path, rid: str, key: str, value: Any, need_literal: bool) -> tuple[list[re.Pattern[str]], list[str]]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleError(path, rid, f"'{key}' must be a string or a list of strings")
    compiled: list[re.Pattern[str]] = []
    literals: list[str] = []
    for src in value:
        try:
            check_bounded(src)
            rx = re.compile(src)
            if need_literal:
                literals.extend(required_literals(src))
        except (PatternError, re.error) as exc:
            raise RuleError(path, rid, f"{key} pattern {src!r} {exc}") from None
        compiled.append(rx)
    return compiled, literals


def _text_list(path: Path, rid: str, data: dict, key: str) -> list[str]:
    v = data.get(key, [])
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RuleError(path, rid, f"'{key}' must be a string or a list of strings")
    return [x.strip() for x in v if x.strip()]


def _examples(path: Path, rid: str, data: dict, key: str) -> list[Example]:
    raw = data.get(key, [])
    if not isinstance(raw, list):
        raise RuleError(path, rid, f"'{key}' must be an array of tables ([[{key}]])")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise RuleError(path, rid, f"{key}[{i}] must be a table")
        unknown = set(item) - {"text", "file", "snapshot", "facts", "note"}
        if unknown:
            raise RuleError(path, rid, f"{key}[{i}] has unknown keys: {', '.join(sorted(unknown))}")
        if sum(k in item for k in ("text", "file", "snapshot")) != 1:
            raise RuleError(path, rid, f"{key}[{i}] needs exactly one of text, file or snapshot")
        out.append(Example(item.get("text"), item.get("file"), item.get("snapshot"),
                           dict(item.get("facts", {})), item.get("note", "")))
    return out


def parse_rule(path: Path, data: dict[str, Any]) -> Rule:
    rid = data.get("id")
    if not isinstance(rid, str) or not _ID.match(rid):
        raise RuleError(path, None, "needs an 'id' of lower-case letters, digits and dashes")
    unknown = set(data) - _KNOWN_KEYS
    if unknown:
        raise RuleError(path, rid, f"unknown keys: {', '.join(sorted(unknown))}")
    kind = data.get("kind", "log")
    if kind not in RULE_KINDS:
        raise RuleError(path, rid, f"kind must be one of {', '.join(RULE_KINDS)}, not {kind!r}")
    category = data.get("category")
    if category not in CATEGORIES:
        raise RuleError(path, rid, f"category {category!r} is not in categories.md")
    severity = data.get("severity", "error")
    if severity not in SEVERITIES:
        raise RuleError(path, rid, f"severity must be one of {', '.join(SEVERITIES)}")
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        raise RuleError(path, rid, "needs a 'title'")
    rule = Rule(
        id=rid, kind=kind, category=category, severity=severity, title=title.strip(), path=path,
        summary=str(data.get("summary", "")).strip(),
        priority=int(data.get("priority", 50)),
        consequence=bool(data.get("consequence", False)),
        min_count=int(data.get("min_count", 1)),
        supersedes=_text_list(path, rid, data, "supersedes"),
        derive=data.get("derive"),
        check=data.get("check"),
        explanation=_text_list(path, rid, data, "explanation"),
        fixes=_text_list(path, rid, data, "fixes"),
        references=_text_list(path, rid, data, "references"),
        versions=str(data.get("versions", "")),
        doc={k: str(v).strip() for k, v in dict(data.get("doc", {})).items()},
        examples=_examples(path, rid, data, "example"),
        near_misses=_examples(path, rid, data, "near_miss"),
    )
    if kind == "log":
        if "patterns" not in data:
            raise RuleError(path, rid, "a log rule needs 'patterns'")
        rule.patterns, rule.literals = _compile(path, rid, "patterns", data["patterns"], True)
        for key in ("unless", "requires", "excludes", "context"):
            if key in data:
                setattr(rule, key, _compile(path, rid, key, data[key], False)[0])
    else:
        if not isinstance(rule.check, str):
            raise RuleError(path, rid, "an env rule needs 'check', the name of its predicate")
    if not rule.examples:
        raise RuleError(path, rid, "needs at least one [[example]] that must match")
    if not rule.near_misses:
        raise RuleError(path, rid, "needs at least one [[near_miss]] that must not match")
    if rule.derive is not None:
        from .derive import DERIVERS

        if rule.derive not in DERIVERS:
            raise RuleError(path, rid, f"derive {rule.derive!r} is not one of: {', '.join(sorted(DERIVERS))}")
    return rule


def builtin_rules_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    shipped = here / "builtin_rules"  # inside the wheel
    if shipped.is_dir():
        return shipped
    return here.parent / "rules"  # a source checkout / editable install


def rule_dirs(extra: list[str | Path] | None = None) -> list[Path]:
    dirs = [builtin_rules_dir()]
    env = os.environ.get("MPDOCTOR_RULES_PATH", "")
    for part in env.split(os.pathsep):
        if part.strip():
            dirs.append(Path(part.strip()).expanduser())
    for d in extra or []:
        dirs.append(Path(d).expanduser())
    return dirs


def load_dir(directory: Path) -> list[Rule]:
    if not directory.is_dir():
        raise RuleError(directory, None, "is not a folder of rules")
    rules = []
    for path in sorted(directory.rglob("*.toml")):
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise RuleError(path, None, f"is not valid TOML: {exc}") from None
        except OSError as exc:
            raise RuleError(path, None, f"cannot be read: {exc.strerror}") from None
        rules.append(parse_rule(path, data))
    return rules


_CACHE: dict[tuple[str, ...], list[Rule]] = {}


def load_rules(extra: list[str | Path] | None = None, kind: str | None = None) -> list[Rule]:
    """All rules: the built-in ones, MPDOCTOR_RULES_PATH, then `extra` folders.

    A later rule with the same id replaces an earlier one, so a user can override a
    built-in rule by writing one of the same id in their own folder.
    """
    dirs = rule_dirs(extra)
    key = tuple(str(d) for d in dirs)
    if key not in _CACHE:
        by_id: dict[str, Rule] = {}
        for d in dirs:
            seen: dict[str, Path] = {}
            for rule in load_dir(d):
                if rule.id in seen:
                    raise RuleError(rule.path, rule.id, f"the same id is already used by {seen[rule.id]}")
                seen[rule.id] = rule.path
                by_id[rule.id] = rule
        _CACHE[key] = list(by_id.values())
    rules = _CACHE[key]
    return [r for r in rules if kind is None or r.kind == kind]
