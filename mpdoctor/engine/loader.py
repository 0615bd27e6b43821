"""Reading rules: the folders, the TOML files, validation, the rule cache.

One rule per file under `rules/` (`log/<category>/`, `env/`, `run/`, `probe/`). A
malformed file gets a `RuleError` naming the file, the rule and what is wrong; so does a
template placeholder that no pattern, deriver or check produces (the fact vocabulary,
engine.facts, is handed in by the caller: the engine knows no face).

Every file a rule names (an example's `file`, `snapshot`, `events`, `probe`) is read
from inside the rule's own folder only: the folder it was loaded from (for the
built-in rules, the project folder holding rules/ and fixtures/). A name that is
absolute, climbs out with `..`, links out, is not a regular file (/dev/zero, a FIFO)
or is larger than MAX_RESOURCE_BYTES is a RuleError naming the rule file, said when the
rule loads and again whenever the file is read.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from .facts import Vocabulary

from ..findings import CATEGORIES, SEVERITIES
from .rule import RULE_KINDS, Example, LazyPattern, Rule, RuleError, cached_examples

_ID = re.compile(r"^[a-z0-9][a-z0-9-]*[a-z0-9]$")

_KNOWN_KEYS = {
    "id", "kind", "category", "severity", "title", "priority", "consequence",
    "patterns", "unless", "requires", "excludes", "context", "frames_after", "min_count", "derive",
    "check", "explanation", "fixes", "references", "versions", "doc", "example",
    "near_miss", "summary", "supersedes", "unrendered", "quiet", "words", "each", "area", "only_in_trouble", "refines", "position", "fix_position",
    "fix_when_alone",
}
# Which evidence an example of each kind may name.
_EXAMPLE_KEYS = {"log": ("text", "file", "events"), "env": ("snapshot", "events", "probe"), "run": ("events",),
                 "probe": ("probe",), "job": ("events",)}


def _compile(path: Path, rid: str, key: str, value: Any, need_literal: bool,
             validate: bool = True, strict: bool = True) -> tuple[list[LazyPattern], list[str]]:
    """Check a pattern list (bounded, valid, and with the literal the prefilter needs)
    and wrap it; compiling waits until a log needs the pattern."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleError(path, rid, f"'{key}' must be a string or a list of strings")
    from .patterns import tolerant

    # backticks, quotes and `__` a rendered or retyped paste lost: optional
    value = [tolerant(v) for v in value]
    literals: list[str] = []
    runs: list[tuple[list[str], bool]] = [([], False)] * len(value)
    if validate:
        from .backtracking import check_bounded
        from .patterns import PatternError, fixed_runs, required_literals

        runs = [fixed_runs(src) for src in value]

        for src in value:
            try:
                check_bounded(src, shapes=strict)
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


def _examples(path: Path, rid: str, data: dict, key: str, kind: str, refines: bool = False) -> list[Example]:
    raw = data.get(key, [])
    if not isinstance(raw, list):
        raise RuleError(path, rid, f"'{key}' must be an array of tables ([[{key}]])")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise RuleError(path, rid, f"{key}[{i}] must be a table")
        unknown = set(item) - {"text", "file", "snapshot", "events", "probe", "facts", "note"}
        if unknown:
            raise RuleError(path, rid, f"{key}[{i}] has unknown keys: {', '.join(sorted(unknown))}")
        allowed = _EXAMPLE_KEYS[kind]
        given = [k for k in ("text", "file", "snapshot", "events", "probe") if k in item]
        if refines:  # a refinement: a log (text or file) explained with a machine's snapshot
            if "snapshot" not in given or len(given) != 2 or not ({"text", "file"} & set(given)):
                raise RuleError(path, rid, f"{key}[{i}] of a refinement rule needs a snapshot and a log (text or file)")
        elif len(given) != 1 or given[0] not in allowed:
            raise RuleError(path, rid, f"{key}[{i}] of a {kind} rule needs exactly one of {' or '.join(allowed)}")
        if "facts" in item and not isinstance(item["facts"], dict):
            raise RuleError(path, rid, f"{key}[{i}]: 'facts' must be a table")
        out.append(Example(item.get("text"), item.get("file"), item.get("snapshot"),
                           dict(item.get("facts", {})), item.get("note", ""), item.get("events"), item.get("probe")))
    return out


_KW = ("id", "kind", "category", "severity", "title", "titles", "priority", "consequence", "literals",
       "min_count", "supersedes", "derive", "derive_module", "check", "quiet", "area", "only_in_trouble",
       "refines", "position", "fix_position", "fix_when_alone")
_PATTERN_KEYS = ("patterns", "unless", "requires", "excludes", "context", "frames_after")


def cache_form(rule: Rule) -> tuple[dict[str, Any], dict[str, list]]:
    """What the rule cache keeps of a validated rule: its constructor's arguments and, per
    pattern list, (source, ordered runs, caseless): nothing left to parse or check."""
    kw = {k: getattr(rule, k) for k in _KW}
    pats = {key: [(p.pattern, tuple(tuple(step) for step in p.runs), p.caseless) for p in getattr(rule, key)]
            for key in _PATTERN_KEYS}
    return kw, pats


def rule_from_cache(path: "str | Path", kw: dict[str, Any], pats: dict[str, list]) -> Rule:
    """A Rule from its cache form (loading ~200 rules this way takes a few milliseconds).
    Raises (TypeError, ValueError) on an entry of another shape: the caller parses the file."""
    if set(kw) != set(_KW) or not isinstance(kw["id"], str) or not isinstance(kw["titles"], list) \
            or not isinstance(kw["literals"], list) or type(kw["priority"]) is not int:
        raise ValueError("a cache entry of another shape")
    return Rule(path=path, **kw, **{key: [LazyPattern(*p) for p in pats.get(key, ())] for key in _PATTERN_KEYS})


def parse_rule(path: Path, data: dict[str, Any], literals: list[str] | None = None,
               derive_module: str | None = None, vocabulary: "Vocabulary | None" = None,
               strict: bool = True) -> Rule:
    """A Rule from one file's TOML data; RuleError says what is wrong.

    `literals` are the prefilter literals from an earlier, validated parse of the very
    same file (the compiled-rules cache): given them, the expensive pattern checks are
    skipped. With a `vocabulary`, every template placeholder must be a fact something
    produces for this rule. `strict` (every rule, built-in or a user's): the patterns'
    shapes are checked too (engine.patterns.check_bounded)."""
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
        raise RuleError(path, rid, f"category {category!r} is not in docs/categories.md")
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
    for key in ("consequence", "quiet", "only_in_trouble", "fix_when_alone"):
        if key in data and not isinstance(data[key], bool):
            raise RuleError(path, rid, f"'{key}' must be true or false")
    if "doc" in data and not isinstance(data["doc"], dict):
        raise RuleError(path, rid, "'doc' must be a table ([doc])")
    if "unrendered" in data and not (isinstance(data["unrendered"], dict)
                                     and all(isinstance(v, str) for v in data["unrendered"].values())):
        raise RuleError(path, rid, "'unrendered' must be a table of \"explanation.N\" / \"fixes.N\" / \"title.N\" = \"why no example renders it\"")
    words = data.get("words", {})
    if not (isinstance(words, dict) and all(isinstance(t, dict) and all(
            isinstance(w, str) or (isinstance(w, list) and w and all(isinstance(x, str) for x in w))
            for w in t.values()) for t in words.values())):
        raise RuleError(path, rid, "'words' must be tables of code = \"words\" ([words.FACT])")
    each = data.get("each", {})
    if not (isinstance(each, dict) and all(isinstance(t, str) or (isinstance(t, list) and t and all(
            isinstance(x, str) for x in t)) for t in each.values())):
        raise RuleError(path, rid, "'each' must be a table of FACT = \"template for one record\" (or a list of "
                                   "them: the first whose facts are known)")
    refines = data.get("refines", [])
    if not (isinstance(refines, list) and all(c in CATEGORIES for c in refines)) or (refines and kind != "env"):
        raise RuleError(path, rid, "'refines' is a list of categories (docs/categories.md), for env rules only")
    for key in ("position", "fix_position"):
        if data.get(key, "last") not in ("first", "last"):
            raise RuleError(path, rid, f"'{key}' must be \"first\" or \"last\"")
    for key in ("derive", "check", "area"):
        if key in data and not isinstance(data[key], str):
            raise RuleError(path, rid, f"'{key}' must be a string")
    if kind != "log" and "check" not in data:
        raise RuleError(path, rid, f"a{'n' if kind[0] in 'aeiou' else ''} {kind} rule needs 'check', the name of its check")
    rule = Rule(
        id=rid, kind=kind, category=category, severity=severity, title=titles[0], titles=titles, path=path,
        summary=str(data.get("summary", "")).strip(),
        priority=int(data.get("priority", 50)),
        consequence=bool(data.get("consequence", False)),
        quiet=bool(data.get("quiet", False)),
        area=data.get("area"),
        only_in_trouble=bool(data.get("only_in_trouble", False)),
        refines=list(refines),
        position=data.get("position", "last"),
        fix_position=data.get("fix_position", data.get("position", "last")),
        fix_when_alone=bool(data.get("fix_when_alone", False)),
        words={str(k): dict(v) for k, v in words.items()},
        each=dict(each),
        min_count=int(data.get("min_count", 1)),
        supersedes=_text_list(path, rid, data, "supersedes"),
        derive=data.get("derive"),
        check=data.get("check"),
        explanation=_text_list(path, rid, data, "explanation"),
        fixes=_text_list(path, rid, data, "fixes"),
        references=_text_list(path, rid, data, "references"),
        versions=str(data.get("versions", "")),
        doc={k: str(v).strip() for k, v in dict(data.get("doc", {})).items()},
        examples=(_examples(path, rid, data, "example", kind, bool(refines)) if validated
                  else cached_examples(data, "example")),
        near_misses=(_examples(path, rid, data, "near_miss", kind, bool(refines)) if validated
                     else cached_examples(data, "near_miss")),
        derive_module=derive_module,
        unrendered={str(k): str(v) for k, v in dict(data.get("unrendered", {})).items()},
    )
    if kind == "log":
        if "patterns" not in data:
            raise RuleError(path, rid, "a log rule needs 'patterns'")
        rule.patterns, found = _compile(path, rid, "patterns", data["patterns"], True, validated, strict)
        if not rule.patterns:
            raise RuleError(path, rid, "'patterns' is empty")
        rule.literals = sorted(set(found)) if validated else list(literals or [])
        for key in ("unless", "requires", "excludes", "context", "frames_after"):
            if key in data:
                setattr(rule, key, _compile(path, rid, key, data[key], False, validated, strict)[0])
    if not rule.examples:
        raise RuleError(path, rid, "needs at least one [[example]] that must match")
    if not rule.near_misses:
        raise RuleError(path, rid, "needs at least one [[near_miss]] that must not match")
    if rule.derive is not None and validated:
        from .derive import deriver_names, module_of

        if module_of(rule.derive) is None:
            raise RuleError(path, rid, f"derive {rule.derive!r} is not one of: {', '.join(deriver_names())}")
        rule.derive_module = module_of(rule.derive)
    _check_unrendered_keys(path, rule)
    _check_unexercised_keys(path, rule, data.get("unexercised", {}))
    if vocabulary is not None and validated:
        problem = vocabulary.problem(rule)
        if problem:
            raise RuleError(path, rid, problem)
    return rule


def _check_unrendered_keys(path: "Path | str", rule: Rule) -> None:
    for key in rule.unrendered:
        part, _, n = key.partition(".")
        templates = {"explanation": rule.explanation, "fixes": rule.fixes, "title": rule.titles}.get(part)
        if templates is None or not n.isdigit() or not 1 <= int(n) <= len(templates):
            raise RuleError(path, rule.id, f"unrendered: {key!r} names no sentence (use explanation.N, fixes.N "
                                           f"or title.N, counting from 1)")


# [unexercised]: a pattern no example matches, and why ("patterns.3" = "why"): read by
# engine.selftest, which fails a rule whose pattern no example matches unless excused here.
_KNOWN_KEYS.add("unexercised")


def _check_unexercised_keys(path: "Path | str", rule: Rule, table: Any) -> None:
    if not (isinstance(table, dict) and all(isinstance(v, str) and v.strip() for v in table.values())):
        raise RuleError(path, rule.id, "'unexercised' must be a table of \"patterns.N\" / \"context.N\" / "
                                       "\"requires.N\" = \"why no example matches it\"")
    for key in table:
        part, _, n = key.partition(".")
        pats = {"patterns": rule.patterns, "context": rule.context, "requires": rule.requires}.get(part)
        if pats is None or not n.isdigit() or not 1 <= int(n) <= len(pats):
            raise RuleError(path, rule.id, f"unexercised: {key!r} names no pattern (use patterns.N, context.N "
                                           f"or requires.N, counting from 1)")


def _builtin_rules_dir() -> str:
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    shipped = os.path.join(here, "builtin_rules")  # inside the wheel
    if os.path.isdir(shipped):
        return shipped
    return os.path.join(os.path.dirname(here), "rules")  # a source checkout / editable install


def builtin_rules_path() -> str:
    """The built-in rules folder (a str: no pathlib on explain's start)."""
    return _builtin_rules_dir()


def _dirs(extra: "list[str | Path] | None" = None) -> list[str]:
    dirs = [_builtin_rules_dir()]
    env = os.environ.get("MPDOCTOR_RULES_PATH", "")
    for part in env.split(os.pathsep):
        if part.strip():
            dirs.append(os.path.expanduser(part.strip()))
    for d in extra or []:
        dirs.append(os.path.expanduser(str(d)))
    return dirs


def _rule_files(directory: "str | Path") -> list[str]:
    """Every *.toml under `directory`, sorted, found with os.scandir (pathlib's rglob
    costs more than parsing a cached rule base). Only regular files (a FIFO or a device
    named x.toml would block the read); a symbolic link is followed only when it stays
    inside the folder (a link to / would walk the whole filesystem), each folder once."""
    found: list[str] = []
    root = os.path.realpath(str(directory))
    inside = root.rstrip(os.sep) + os.sep
    seen: set[str] = {root}
    stack = [str(directory)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for entry in it:
                    if entry.name.startswith((".", "_")):
                        continue  # hidden, or not a rule (rules/_frames.toml: words that frame a rule's)
                    try:
                        link = entry.is_symlink()
                        if link:
                            real = os.path.realpath(entry.path)
                            if not real.startswith(inside):
                                continue  # out of the rules folder
                        if entry.is_dir():
                            key = os.path.realpath(entry.path)
                            if key not in seen:
                                seen.add(key)
                                stack.append(entry.path)
                        elif entry.name.endswith(".toml") and entry.is_file():
                            found.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue
    return sorted(found)


MAX_RULE_BYTES = 1 << 20  # a rule file is a few KB: a bigger one is not a rule


def _read_toml(path: "str | Path") -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_RULE_BYTES + 1)
        if len(data) > MAX_RULE_BYTES:
            raise RuleError(path, None, f"is larger than {MAX_RULE_BYTES >> 20} MB: not a rule file")
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(path, None, f"is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise RuleError(path, None, f"is not UTF-8 text: {exc}") from None
    except RecursionError:
        raise RuleError(path, None, "is nested too deeply to be a rule file") from None
    except OSError as exc:
        raise RuleError(path, None, f"cannot be read: {exc.strerror or exc}") from None


def _stat_files(directory: "str | Path") -> list[tuple[str, str, int]]:
    """(path, stat key, size) of each rule file. The stat key (inode, mtime, ctime) only
    says whether the file may have changed since the cache hashed it: the cache trusts
    the bytes' digest, not the modification time (`cp -p` and `rsync -t` keep that while
    the rule changes; no tool can keep the ctime of a file it writes)."""
    out = []
    for p in _rule_files(directory):
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append((p, f"{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}", st.st_size))
    return out


def load_dir(directory: "str | Path", _files: list[tuple[str, int, int]] | None = None,
             vocabulary: "Vocabulary | None" = None) -> list[Rule]:
    """The rules in one folder (and its subfolders); RuleError for the first bad one."""
    from . import rulecache

    if not os.path.isdir(directory):
        raise RuleError(directory, None, "is not a folder of rules")
    folder = os.path.realpath(str(directory))
    builtin = folder == os.path.realpath(_builtin_rules_dir())
    cache = rulecache.get()
    rules = []
    for name, stat_key, size in (_files if _files is not None else _stat_files(directory)):
        path = name  # a str: Rule.path makes the Path when someone asks for it
        cached = cache.lookup(name, stat_key, size, checked=vocabulary is not None)
        if cached is not None:
            try:
                rule = rule_from_cache(path, *cached)
            except Exception:  # an entry of another shape (edited, another version): parse the file
                rule = None
            if rule is not None:
                rule._docs = (lambda name=name: cache.docs(name))
                rule.folder = folder
                rules.append(rule if builtin else budgeted(rule))
                continue
        data = _read_toml(path)
        rule = parse_rule(path, data, vocabulary=vocabulary)
        rule.folder = folder
        check_resources(rule)  # before the cache keeps it
        cache.store(name, stat_key, size, data, *cache_form(rule), checked=vocabulary is not None)
        rules.append(rule if builtin else budgeted(rule))
    cache.save()
    return rules


# --- a user's patterns run under a time budget per line -----------------------------------

LINE_BUDGET_S = 0.25  # CPU seconds: a pattern takes microseconds on a line; one that backtracks, minutes


class _OverBudget(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _OverBudget  # raised inside the regex engine, which checks for signals as it runs


class BudgetedPattern(LazyPattern):
    """A user rule's pattern: every search of one line runs under LINE_BUDGET_S (an
    interval timer whose signal stops the regex engine). A pattern the backtracking
    checker let through (engine.patterns) that still runs away on a line is stopped
    there, said once on stderr naming its rule, and skipped for the rest of the input:
    `explain` finishes. The time is the process's CPU time (ITIMER_VIRTUAL), not the
    clock's: a busy machine does not stop a sound pattern. The built-in rules are held
    to the fuzz test instead."""

    __slots__ = ("rule_id", "rule_path", "stopped")

    def __init__(self, pattern: str, runs: Any = (), caseless: bool = False, rule_id: str = "",
                 rule_path: str = ""):
        super().__init__(pattern, runs, caseless)
        self.rule_id, self.rule_path, self.stopped = rule_id, rule_path, False

    def _run(self, call: Any) -> Any:
        if self.stopped:
            return None
        import signal

        try:
            if signal.getitimer(signal.ITIMER_VIRTUAL)[0] > 0:
                return call()  # someone else's timer is running: leave it alone
            previous = signal.signal(signal.SIGVTALRM, _alarm)
        except (AttributeError, ValueError, OSError):  # no SIGVTALRM (Windows), not the main thread
            return call()
        try:
            signal.setitimer(signal.ITIMER_VIRTUAL, LINE_BUDGET_S)
            try:
                return call()
            finally:
                signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        except _OverBudget:
            self._stop()
            return None
        finally:
            signal.signal(signal.SIGVTALRM, previous)

    def _stop(self) -> None:
        self.stopped = True
        if sys.stderr is not None:
            from ..redact import scrub

            try:
                sys.stderr.write(scrub(
                    f"mpdoctor: rule {self.rule_id!r} ({self.rule_path}): the pattern {self.pattern!r} took more than "
                    f"{LINE_BUDGET_S:g} s on one line; it is skipped for the rest of this input (it backtracks: "
                    "make each part match in one way only)\n"))
            except (OSError, ValueError):
                pass

    def search(self, string: str, *args: int) -> Any:
        return self._run(lambda: LazyPattern.search(self, string, *args))

    def match(self, string: str, *args: int) -> Any:
        return self._run(lambda: LazyPattern.match(self, string, *args))

    def search_folded(self, string: str) -> Any:
        return self._run(lambda: LazyPattern.search_folded(self, string))

    def finditer(self, string: str, *args: int) -> Any:
        return iter(self._run(lambda: list(LazyPattern.finditer(self, string, *args))) or ())


def budgeted(rule: Rule) -> Rule:
    """The rule with each of its patterns under the per-line budget (BudgetedPattern)."""
    for key in _PATTERN_KEYS:
        setattr(rule, key, [BudgetedPattern(p.pattern, p.runs, p.caseless, rule.id, str(rule._path))
                            for p in getattr(rule, key)])
    return rule


# --- the files a rule names -------------------------------------------------------------

MAX_RESOURCE_BYTES = 1 << 20  # an example log, snapshot or recorded run is a few KB
_RESOURCE_KEYS = ("file", "snapshot", "events", "probe")


def _resource_bases(rule: Rule) -> tuple[str, list[str]]:
    """(the folder the rule's files must stay inside, the folders a name is looked up
    in, in order). A built-in rule names files from the project folder (`fixtures/...`,
    beside rules/); a user's rule from its own file's folder, then the folder it was
    loaded from."""
    real = os.path.realpath(str(rule._path))
    here = os.path.dirname(real)
    builtin = os.path.realpath(_builtin_rules_dir())
    if real.startswith(builtin + os.sep):
        project = os.path.dirname(builtin)
        return project, [here, project, builtin]
    folder = getattr(rule, "folder", None)
    root = os.path.realpath(folder) if folder else here
    return root, [here, root] if here != root else [root]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resource_path(rule: Rule, name: Any) -> "Path":
    """Where the file a rule's example names is, checked: inside the rule's folder, a
    regular file, at most MAX_RESOURCE_BYTES. RuleError (naming the rule file) for one
    it may not read; a name found nowhere gives a path that does not exist (the caller
    says "not found")."""
    import stat
    from pathlib import Path

    def refuse(problem: str) -> RuleError:
        return RuleError(rule._path, rule.id, f"example file {name!r} {problem}")

    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise refuse("is not a file name")
    root, bases = _resource_bases(rule)
    if os.path.isabs(name) or name.startswith("~") or re.match(r"^[A-Za-z]:[\\/]", name):
        raise refuse(f"is an absolute path: a rule reads files inside its own folder only ({root})")
    if ".." in re.split(r"[\\/]+", name):
        raise refuse(f"climbs out with '..': a rule reads files inside its own folder only ({root})")
    found = next((os.path.join(b, name) for b in bases if os.path.lexists(os.path.join(b, name))), None)
    if found is None:
        return Path(os.path.join(root, name))
    real = os.path.realpath(found)
    if not _inside(real, root):
        raise refuse(f"is a link out of the rule's folder ({root})")
    try:
        st = os.stat(real)
    except OSError:  # a link to nothing: not found
        return Path(real)
    if not stat.S_ISREG(st.st_mode):
        raise refuse("is not a regular file (a device, a FIFO, a folder): not read")
    if st.st_size > MAX_RESOURCE_BYTES:
        raise refuse(f"is larger than {MAX_RESOURCE_BYTES >> 20} MB: not read")
    return Path(real)


def read_resource(rule: Rule, name: Any) -> bytes:
    """The bytes of a file a rule's example names, as resource_path checks it, read
    without following a link swapped in since and never past MAX_RESOURCE_BYTES.
    OSError when it is not there."""
    import stat

    path = resource_path(rule, name)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RuleError(rule._path, rule.id, f"example file {name!r} is not a regular file: not read")
        chunks, size = [], 0
        while size <= MAX_RESOURCE_BYTES:
            chunk = os.read(fd, min(1 << 16, MAX_RESOURCE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_RESOURCE_BYTES:
        raise RuleError(rule._path, rule.id, f"example file {name!r} is larger than {MAX_RESOURCE_BYTES >> 20} MB: "
                                             "not read")
    return b"".join(chunks)


def check_resources(rule: Rule) -> None:
    """Every file the rule's examples and near misses name may be read (RuleError for
    the first that may not); a missing one is left to `rules test` to report."""
    for ex in list(rule.examples) + list(rule.near_misses):
        for key in _RESOURCE_KEYS:
            name = getattr(ex, key, None)
            if name is not None:
                resource_path(rule, name)


_CACHE: dict[tuple[str, ...], tuple[tuple, list[Rule]]] = {}


def load_rules(extra: "list[str | Path] | None" = None, kind: str | None = None,
               vocabulary: "Vocabulary | None" = None) -> list[Rule]:
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
            for rule in load_dir(d, d_files, vocabulary):
                if rule.id in seen:
                    raise RuleError(rule.path, rule.id, f"the same id is already used by {seen[rule.id]}")
                seen[rule.id] = str(rule._path)
                by_id[rule.id] = rule
        _CACHE[key] = (sig, list(by_id.values()))
    rules = _CACHE[key][1]
    return [r for r in rules if kind is None or r.kind == kind]
