"""The `explain` and `rules` faces: a few lines each over the core."""

from __future__ import annotations

import os
import sys
import time
from argparse import Namespace

from .engine.rules import Rule, RuleError, load_dir, load_rules
from .findings import has_error

EXIT_OK, EXIT_ERROR_FINDING, EXIT_BAD_INPUT = 0, 1, 2


def fail(message: str) -> int:
    sys.stderr.write(f"mpdoctor: {message}\n")
    return EXIT_BAD_INPUT


def load_or_fail(extra: list[str]) -> list[Rule] | int:
    try:
        return load_rules(extra)
    except RuleError as exc:
        return fail(f"bad rule: {exc}")


class ProgressLine:
    """'reading train.log: 312 MB of 500 MB (62%)' on stderr, only when stderr is a
    terminal and only once reading has taken a moment (MPDOCTOR_PROGRESS_AFTER seconds,
    1.5 by default), so that short runs and pipes never see it."""

    def __init__(self, name: str, stream=None):
        self.name = name
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        try:
            self.after = float(os.environ.get("MPDOCTOR_PROGRESS_AFTER", "1.5"))
        except ValueError:
            self.after = 1.5
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False
        self.last = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.started < self.after or now - self.last < 0.2:
            return
        self.last = now
        mb = done / 1e6
        if total:
            text = f"reading {self.name}: {mb:,.0f} MB of {total / 1e6:,.0f} MB ({100 * done / total:.0f}%)"
        else:
            text = f"reading {self.name}: {mb:,.0f} MB"
        self.stream.write(f"\rmpdoctor: {text}\x1b[K")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _internal_error(exc: BaseException) -> int:
    """Last resort: one clear line instead of mpdoctor's own traceback."""
    if os.environ.get("MPDOCTOR_DEBUG") == "1":
        raise exc
    return fail(f"internal error ({type(exc).__name__}: {exc}); rerun with MPDOCTOR_DEBUG=1 "
                "to see where, and please report it")


def explain_main(args: Namespace) -> int:
    try:
        return _explain(args)
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except RecursionError as exc:
        return _internal_error(exc)
    except MemoryError:
        return fail("not enough memory to read this log")
    except Exception as exc:  # never a traceback of mpdoctor itself
        return _internal_error(exc)


def _explain(args: Namespace) -> int:
    from .explain import explain_path
    from .render import emit
    from .scan import InputError

    rules = load_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    progress = ProgressLine("standard input" if args.path == "-" else os.path.basename(args.path))
    try:
        report = explain_path(args.path, rules, progress)
    except InputError as exc:
        progress.done()
        return fail(str(exc))
    progress.done()
    if args.snapshot or args.here:
        try:
            from .env.sharpen import sharpen_report
        except ImportError:
            sys.stderr.write("mpdoctor: --snapshot/--here are not available in this build\n")
        else:
            try:
                sharpen_report(report, snapshot_path=args.snapshot, here=args.here)
            except (OSError, ValueError) as exc:
                return fail(f"cannot use the snapshot: {exc}")
    emit(report, args.format, heading=f"mpdoctor explain {report.input.get('path', '')}".strip())
    return EXIT_ERROR_FINDING if has_error(report.findings) else EXIT_OK


def rules_main(args: Namespace) -> int:
    try:
        return _rules(args)
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as exc:  # never a traceback of mpdoctor itself
        return _internal_error(exc)


def _rules(args: Namespace) -> int:
    rules = load_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    if args.rules_command == "list":
        return _rules_list(rules, args)
    if args.rules_command == "show":
        return _rules_show(rules, args)
    return _rules_test(rules, args)


def _rules_list(rules: list[Rule], args: Namespace) -> int:
    import json

    chosen = [r for r in rules if not args.category or r.category == args.category]
    chosen.sort(key=lambda r: (r.kind, r.category, r.id))
    if args.format == "json":
        sys.stdout.write(json.dumps([{"id": r.id, "kind": r.kind, "category": r.category,
                                      "severity": r.severity, "title": r.title,
                                      "path": str(r.path)} for r in chosen], indent=2) + "\n")
        return EXIT_OK
    if args.format == "markdown":
        sys.stdout.write("| id | kind | category | severity | title |\n|---|---|---|---|---|\n")
        for r in chosen:
            sys.stdout.write(f"| `{r.id}` | {r.kind} | `{r.category}` | {r.severity} | {r.title} |\n")
        return EXIT_OK
    from rich.table import Table

    from .render import make_console

    table = Table(title=f"{len(chosen)} rules", show_lines=False)
    for col in ("id", "kind", "category", "severity", "title"):
        table.add_column(col)
    for r in chosen:
        table.add_row(r.id, r.kind, r.category, r.severity, r.title)
    make_console().print(table)
    return EXIT_OK


def _placeholders(template: str) -> str:
    """A template shown as documentation: {requested} -> <requested>."""
    import re

    return re.sub(r"\{(\w+)[^{}]*\}", r"<\1>", template)


def rule_doc_markdown(rule: Rule, rules: list[Rule] | None = None) -> str:
    """A rule's page in ruff's shape: what it detects, why it happens, known problems,
    an example (with what mpdoctor reports on it), the fix, a look-alike, references."""
    from .engine.selftest import example_text

    out = [f"# {rule.id}", "", f"**{_placeholders(rule.title)}**", "",
           f"category `{rule.category}` · severity {rule.severity} · {rule.kind} rule", ""]
    if rule.versions:
        out += [f"Versions: {rule.versions}", ""]
    for name, body in (("What it detects", rule.doc.get("detects") or rule.summary),
                       ("Why it happens", rule.doc.get("why", "")),
                       ("Known problems", rule.doc.get("known_problems", ""))):
        if body:
            out += [f"## {name}", "", body, ""]
    if rule.examples:
        ex = rule.examples[0]
        out += ["## Example", ""]
        if ex.note:
            out += [ex.note, ""]
        if ex.snapshot:
            out += [f"The environment snapshot `{ex.snapshot}`.", ""]
        else:
            try:
                text = example_text(rule, ex)
            except OSError:
                text = f"(example file {ex.file} not found)"
            lines = text.strip("\n").split("\n")
            out += ["```text", "\n".join(lines[-25:]), "```", ""]
            if rule.kind == "log":
                from .explain import explain_text

                try:
                    report = explain_text(text, rules if rules is not None else [rule])
                except Exception:  # the page is still useful without it
                    report = None
                found = [f for f in report.findings if f.rule == rule.id] if report else []
                if found:
                    f = found[0]
                    out += ["mpdoctor reports:", "", f"> **{f.title}**", ">"]
                    out += [f"> {f.explanation}", ""] if f.explanation else [""]
    if rule.fixes:
        out += ["## Fix", ""] + [f"{i}. {_placeholders(f)}" for i, f in enumerate(rule.fixes, 1)] + [""]
    if rule.doc.get("fix"):
        out += [rule.doc["fix"], ""]
    if rule.near_misses and rule.kind == "log":
        nm = rule.near_misses[0]
        try:
            text = example_text(rule, nm)
        except OSError:
            text = ""
        if text.strip():
            out += ["## Not this rule", ""] + ([nm.note, ""] if nm.note else [])
            out += ["```text", "\n".join(text.strip("\n").split("\n")[-12:]), "```", ""]
    if rule.references:
        out += ["## References", ""] + [f"- <{r}>" for r in rule.references] + [""]
    out += [f"{len(rule.examples)} example(s), {len(rule.near_misses)} near miss(es), tested by "
            f"`mpdoctor rules test` · `{rule.path}`", ""]
    return "\n".join(out)


def _rules_show(rules: list[Rule], args: Namespace) -> int:
    import json

    by_id = {r.id: r for r in rules}
    rule = by_id.get(args.rule_id)
    if rule is None:
        import difflib

        close = difflib.get_close_matches(args.rule_id, list(by_id), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `mpdoctor rules list`"
        return fail(f"no rule {args.rule_id!r}{hint}")
    doc = rule_doc_markdown(rule, rules)
    if args.format == "json":
        sys.stdout.write(json.dumps({"id": rule.id, "kind": rule.kind, "category": rule.category,
                                     "severity": rule.severity, "title": rule.title, "doc": rule.doc,
                                     "fixes": rule.fixes, "references": rule.references,
                                     "path": str(rule.path)}, indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(doc)
    else:
        from rich.markdown import Markdown

        from .render import make_console

        make_console().print(Markdown(doc))
    return EXIT_OK


def _rules_test(rules: list[Rule], args: Namespace) -> int:
    import json

    from .engine.selftest import run_selftest

    only = None
    if args.dir:
        try:
            from pathlib import Path

            extra = load_dir(Path(args.dir))
        except RuleError as exc:
            return fail(f"bad rule: {exc}")
        ids = {r.id for r in extra}
        rules = [r for r in rules if r.id not in ids] + extra
        only = extra
    results = run_selftest(rules, only)
    failed = [r for r in results if not r.ok]
    tested = len({r.rule for r in results})
    if args.format == "json":
        sys.stdout.write(json.dumps({"rules": tested, "cases": len(results), "failed": [
            {"rule": r.rule, "case": f"{r.kind}[{r.index}]", "message": r.message} for r in failed]}, indent=2) + "\n")
    else:
        for r in failed:
            sys.stdout.write(f"FAIL {r.rule} {r.kind}[{r.index}]: {r.message}\n")
        sys.stdout.write(f"{tested} rules, {len(results)} cases: {len(results) - len(failed)} passed, {len(failed)} failed\n")
    return EXIT_ERROR_FINDING if failed else EXIT_OK
