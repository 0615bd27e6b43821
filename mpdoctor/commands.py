"""The `explain` and `rules` faces: a few lines each over the core."""

from __future__ import annotations

import sys
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


def explain_main(args: Namespace) -> int:
    from .explain import explain_path
    from .render import emit
    from .scan import InputError

    rules = load_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    try:
        report = explain_path(args.path, rules)
    except InputError as exc:
        return fail(str(exc))
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


def rule_doc_markdown(rule: Rule) -> str:
    """A rule's page, in ruff's shape: what it detects, why, example, fix, references."""
    from .engine.selftest import example_text

    out = [f"# {rule.id}", "", f"**{rule.title}**", "",
           f"category `{rule.category}` · severity {rule.severity} · {rule.kind} rule · `{rule.path}`", ""]
    if rule.versions:
        out += [f"Versions: {rule.versions}", ""]
    sections = [("What it detects", rule.doc.get("detects") or rule.summary),
                ("Why it happens", rule.doc.get("why", "")),
                ("Known problems", rule.doc.get("known_problems", ""))]
    for name, body in sections:
        if body:
            out += [f"## {name}", "", body, ""]
    if rule.examples:
        ex = rule.examples[0]
        out += ["## Example", ""]
        if ex.snapshot:
            out += [f"The snapshot `{ex.snapshot}`.", ""]
        else:
            try:
                text = example_text(rule, ex)
            except OSError:
                text = f"(example file {ex.file} not found)"
            lines = text.strip("\n").split("\n")
            shown = "\n".join(lines[-25:])
            out += ["```text", shown, "```", ""]
    if rule.fixes:
        out += ["## Fix", ""] + [f"{i}. {f}" for i, f in enumerate(rule.fixes, 1)] + [""]
    if rule.doc.get("fix"):
        out += [rule.doc["fix"], ""]
    if rule.references:
        out += ["## References", ""] + [f"- <{r}>" for r in rule.references] + [""]
    out += [f"{len(rule.examples)} example(s), {len(rule.near_misses)} near miss(es): `mpdoctor rules test`.", ""]
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
    doc = rule_doc_markdown(rule)
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
            extra = load_dir(__import__("pathlib").Path(args.dir))
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
