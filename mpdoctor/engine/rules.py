"""Rules as data: the TOML format, loading and validation.

One rule per file under `rules/` (log rules in `rules/log/<category>/`, environment
rules in `rules/env/`). The format is documented in rules/README.md; a malformed file
gets a `RuleError` naming the file, the rule and what is wrong.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

from ..findings import CATEGORIES, SEVERITIES
from .fixedruns import runs_in_order

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


class LazyPattern:
    """A rule's regular expression, compiled the first time it is used.

    A rule base of a hundred rules has a few hundred patterns; compiling them all costs
    more than the rest of `mpdoctor explain` on a short traceback, and a log touches
    only the few whose literal it contains. Behaves like the `re.Pattern` it wraps.
    """

    __slots__ = ("pattern", "_rx", "runs", "caseless")

    def __init__(self, pattern: str, runs=(), caseless: bool = False):
        self.pattern = pattern
        self._rx: re.Pattern[str] | None = None
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
    """A rule's own test case: text, a file under fixtures/, or (env rules) a snapshot."""

    __slots__ = ("text", "file", "snapshot", "facts", "note")

    def __init__(self, text: str | None = None, file: str | None = None, snapshot: str | None = None,
                 facts: dict[str, Any] | None = None, note: str = ""):
        self.text = text
        self.file = file
        self.snapshot = snapshot
        self.facts = facts if facts is not None else {}
        self.note = note

    def __repr__(self) -> str:
        return f"Example(text={self.text!r}, file={self.file!r}, snapshot={self.snapshot!r}, facts={self.facts!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Example) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)


_RULE_FIELDS = (
    "id", "kind", "category", "severity", "title", "titles", "path", "summary", "priority", "consequence", "patterns",
    "unless", "requires", "excludes", "context", "literals", "min_count", "supersedes", "derive", "derive_module",
    "check", "explanation", "fixes", "references", "versions", "doc", "examples", "near_misses",
)


class Rule:
    """One rule (a TOML file). A plain class, not a dataclass (creating one costs about a
    millisecond at import, and `explain` must start like a small script); `path` is a
    pathlib.Path made on first use, for the same reason (pathlib imports urllib)."""

    def __init__(self, id: str, kind: str, category: str, severity: str, title: str, path: "Path | str",
                 summary: str = "", priority: int = 50, consequence: bool = False,
                 patterns: list[LazyPattern] | None = None, unless: list[LazyPattern] | None = None,
                 requires: list[LazyPattern] | None = None, excludes: list[LazyPattern] | None = None,
                 context: list[LazyPattern] | None = None, literals: list[str] | None = None, min_count: int = 1,
                 supersedes: list[str] | None = None, derive: str | None = None, derive_module: str | None = None,
                 check: str | None = None, explanation: list[str] | None = None, fixes: list[str] | None = None,
                 references: list[str] | None = None, versions: str = "", doc: dict[str, str] | None = None,
                 examples: list[Example] | None = None, near_misses: list[Example] | None = None,
                 titles: list[str] | None = None):
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
        self.patterns = patterns or []
        self.unless = unless or []
        self.requires = requires or []
        self.excludes = excludes or []
        self.context = context or []
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

    # doc, examples and near misses are not needed to explain a log: from the rule cache
    # they are read (a separate file) the first time one of them is asked for.
    def _load_docs(self) -> None:
        loader, self._docs = self._docs, None
        if loader is not None:
            data = loader() or {}
            self._doc = {k: str(v).strip() for k, v in dict(data.get("doc", {})).items()}
            self._examples = _cached_examples(data, "example")
            self._near_misses = _cached_examples(data, "near_miss")
            for key in ("explanation", "fixes", "references"):
                v = data.get(key, [])
                setattr(self, "_" + key, [v.strip()] if isinstance(v, str) else [x.strip() for x in v if x.strip()])
            self._summary = str(data.get("summary", "")).strip()
            self._versions = str(data.get("versions", ""))

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


def _compile(path: Path, rid: str, key: str, value: Any, need_literal: bool,
             validate: bool = True) -> tuple[list[LazyPattern], list[str]]:
    """Check a pattern list (bounded, valid, and with the literal the prefilter needs)
    and wrap it; compiling waits until a log needs the pattern."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleError(path, rid, f"'{key}' must be a string or a list of strings")
    literals: list[str] = []
    runs: list[tuple[list[str], bool]] = [([], False)] * len(value)
    if validate:
        from .patterns import PatternError, check_bounded, fixed_runs, required_literals

        runs = [fixed_runs(src) for src in value]

        for src in value:
            try:
                check_bounded(src)
                re.compile(src)
                if need_literal:
                    literals.extend(required_literals(src))
            except re.error as exc:
                raise RuleError(path, rid, f"{key}: the pattern {src!r} is not a valid regular expression: {exc}") from None
            except PatternError as exc:
                raise RuleError(path, rid, f"{key}: the pattern {src!r} {exc}") from None
    return [LazyPattern(src, r, c) for src, (r, c) in zip(value, runs)], literals


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


def _cached_examples(data: dict, key: str) -> list[Example]:
    """Examples of a file already validated once (the rule cache): no checks again."""
    return [Example(d.get("text"), d.get("file"), d.get("snapshot"), dict(d.get("facts", {})), d.get("note", ""))
            for d in data.get(key, [])]


_KW = ("id", "kind", "category", "severity", "title", "titles", "priority", "consequence", "literals",
       "min_count", "supersedes", "derive", "derive_module", "check")
_PATTERN_KEYS = ("patterns", "unless", "requires", "excludes", "context")


def cache_form(rule: Rule) -> tuple[dict[str, Any], dict[str, list]]:
    """What the rule cache keeps of a validated rule: its constructor's arguments and, per
    pattern list, (source, ordered runs, caseless): nothing left to parse or check."""
    kw = {k: getattr(rule, k) for k in _KW}
    pats = {key: [(p.pattern, tuple(tuple(step) for step in p.runs), p.caseless) for p in getattr(rule, key)]
            for key in _PATTERN_KEYS}
    return kw, pats


def rule_from_cache(path: "str | Path", kw: dict[str, Any], pats: dict[str, list]) -> Rule:
    """A Rule from its cache form (loading ~200 rules this way takes a few milliseconds)."""
    return Rule(path=path, **kw, **{key: [LazyPattern(*p) for p in pats.get(key, ())] for key in _PATTERN_KEYS})


def parse_rule(path: Path, data: dict[str, Any], literals: list[str] | None = None,
               derive_module: str | None = None) -> Rule:
    """A Rule from one file's TOML data; RuleError says what is wrong.

    `literals` are the prefilter literals from an earlier, validated parse of the very
    same file (the compiled-rules cache): given them, the expensive pattern checks are
    skipped."""
    validated = literals is None
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
    titles = title if isinstance(title, list) else [title]
    if not titles or not all(isinstance(t, str) and t.strip() for t in titles):
        raise RuleError(path, rid, "needs a 'title' (a string, or a list of strings: the first whose facts are known wins)")
    titles = [t.strip() for t in titles]
    for key in ("priority", "min_count"):
        if key in data and (not isinstance(data[key], int) or isinstance(data[key], bool)):
            raise RuleError(path, rid, f"'{key}' must be a whole number, not {data[key]!r}")
    if "consequence" in data and not isinstance(data["consequence"], bool):
        raise RuleError(path, rid, "'consequence' must be true or false")
    if "doc" in data and not isinstance(data["doc"], dict):
        raise RuleError(path, rid, "'doc' must be a table ([doc])")
    for key in ("derive", "check"):
        if key in data and not isinstance(data[key], str):
            raise RuleError(path, rid, f"'{key}' must be a string")
    rule = Rule(
        id=rid, kind=kind, category=category, severity=severity, title=titles[0], titles=titles, path=path,
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
        examples=_examples(path, rid, data, "example") if validated else _cached_examples(data, "example"),
        near_misses=_examples(path, rid, data, "near_miss") if validated else _cached_examples(data, "near_miss"),
        derive_module=derive_module,
    )
    if kind == "log":
        if "patterns" not in data:
            raise RuleError(path, rid, "a log rule needs 'patterns'")
        rule.patterns, found = _compile(path, rid, "patterns", data["patterns"], True, validated)
        if not rule.patterns:
            raise RuleError(path, rid, "'patterns' is empty")
        rule.literals = sorted(set(found)) if validated else list(literals or [])
        for key in ("unless", "requires", "excludes", "context"):
            if key in data:
                setattr(rule, key, _compile(path, rid, key, data[key], False, validated)[0])
    else:
        if not isinstance(rule.check, str):
            raise RuleError(path, rid, "an env rule needs 'check', the name of its predicate")
    if not rule.examples:
        raise RuleError(path, rid, "needs at least one [[example]] that must match")
    if not rule.near_misses:
        raise RuleError(path, rid, "needs at least one [[near_miss]] that must not match")
    if rule.derive is not None and validated:
        from .derive import DERIVERS, module_of

        if rule.derive not in DERIVERS:
            raise RuleError(path, rid, f"derive {rule.derive!r} is not one of: {', '.join(sorted(DERIVERS))}")
        rule.derive_module = module_of(rule.derive)
    return rule


def _builtin_rules_dir() -> str:
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    shipped = os.path.join(here, "builtin_rules")  # inside the wheel
    if os.path.isdir(shipped):
        return shipped
    return os.path.join(os.path.dirname(here), "rules")  # a source checkout / editable install


def builtin_rules_dir() -> "Path":
    from pathlib import Path

    return Path(_builtin_rules_dir())


def _dirs(extra: "list[str | Path] | None" = None) -> list[str]:
    dirs = [_builtin_rules_dir()]
    env = os.environ.get("MPDOCTOR_RULES_PATH", "")
    for part in env.split(os.pathsep):
        if part.strip():
            dirs.append(os.path.expanduser(part.strip()))
    for d in extra or []:
        dirs.append(os.path.expanduser(str(d)))
    return dirs


def rule_dirs(extra: "list[str | Path] | None" = None) -> "list[Path]":
    from pathlib import Path

    return [Path(d) for d in _dirs(extra)]


def _rule_files(directory: "str | Path") -> list[str]:
    """Every *.toml under `directory`, sorted, found with os.scandir (pathlib's rglob
    costs more than parsing a cached rule base)."""
    found: list[str] = []
    stack = [str(directory)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for entry in it:
                    if entry.name.startswith("."):
                        continue
                    if entry.is_dir():
                        stack.append(entry.path)
                    elif entry.name.endswith(".toml"):
                        found.append(entry.path)
        except OSError:
            continue
    return sorted(found)


def _read_toml(path: "str | Path") -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(path, None, f"is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise RuleError(path, None, f"is not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise RuleError(path, None, f"cannot be read: {exc.strerror or exc}") from None


def _stat_files(directory: "str | Path") -> list[tuple[str, int, int]]:
    out = []
    for p in _rule_files(directory):
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append((p, st.st_mtime_ns, st.st_size))
    return out


def load_dir(directory: "str | Path", _files: list[tuple[str, int, int]] | None = None) -> list[Rule]:
    """The rules in one folder (and its subfolders); RuleError for the first bad one."""
    from . import rulecache

    if not os.path.isdir(directory):
        raise RuleError(directory, None, "is not a folder of rules")
    cache = rulecache.get()
    rules = []
    for name, mtime_ns, size in (_files if _files is not None else _stat_files(directory)):
        path = name  # a str: Rule.path makes the Path when someone asks for it
        cached = cache.lookup(name, mtime_ns, size)
        if cached is not None:
            rule = rule_from_cache(path, *cached)
            rule._docs = (lambda name=name: cache.docs(name))
            rules.append(rule)
            continue
        data = _read_toml(path)
        rule = parse_rule(path, data)
        cache.store(name, mtime_ns, size, data, *cache_form(rule))
        rules.append(rule)
    cache.save()
    return rules


_CACHE: dict[tuple[str, ...], tuple[tuple, list[Rule]]] = {}




def load_rules(extra: list[str | Path] | None = None, kind: str | None = None) -> list[Rule]:
    """All rules: the built-in ones, MPDOCTOR_RULES_PATH, then `extra` folders.

    A later rule with the same id replaces an earlier one, so a user can override a
    built-in rule by writing one of the same id in their own folder. The result is
    reused within a process while no rule file changes.
    """
    dirs = _dirs(extra)
    key = tuple(dirs)
    files = [_stat_files(d) for d in dirs]
    sig = tuple(tuple(f) for f in files)
    if key not in _CACHE or _CACHE[key][0] != sig:
        by_id: dict[str, Rule] = {}
        for d, d_files in zip(dirs, files):
            seen: dict[str, str] = {}
            for rule in load_dir(d, d_files):
                if rule.id in seen:
                    raise RuleError(rule.path, rule.id, f"the same id is already used by {seen[rule.id]}")
                seen[rule.id] = str(rule._path)
                by_id[rule.id] = rule
        _CACHE[key] = (sig, list(by_id.values()))
    rules = _CACHE[key][1]
    return [r for r in rules if kind is None or r.kind == kind]
