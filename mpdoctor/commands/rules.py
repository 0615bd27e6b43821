"""`mpdoctor rules`: list, show and test the rule base."""

from __future__ import annotations

import sys
from argparse import Namespace
from typing import Any

from ..engine.rule import RULE_KINDS, Rule, RuleError
from . import EXIT_ERROR_FINDING, EXIT_OK, env_help, fail, load_rules_or_fail

DESCRIPTION = ("The knowledge mpdoctor uses, as data under rules/: log rules (read log\n"
               "text), env rules (judge an environment snapshot), run rules (judge a\n"
               "wrapped run's recorded events) and probe rules (judge the probe's\n"
               "measurements). A rule reads example files inside its own folder only.\n\n"
               "  mpdoctor rules list\n  mpdoctor rules list --kind run\n  mpdoctor rules show cuda-oom\n"
               "  mpdoctor rules test            # every rule's examples and near misses\n"
               "  mpdoctor rules test ./my-rules # your own rules folder")
EPILOG = ("exit status:\n  0  done (rules test: every case passed)\n"
          "  1  rules test: a case failed\n  2  a rule file is malformed, or the arguments are wrong\n"
          + env_help("MPDOCTOR_RULES_PATH", "MPDOCTOR_CACHE_DIR", "MPDOCTOR_NO_CACHE", "MPDOCTOR_DEBUG", "NO_COLOR"))


def add_arguments(p: Any) -> None:
    from . import add_output_options

    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION")
    rl = rsub.add_parser("list", help="one line per rule", description="The rules, grouped by kind and category.")
    add_output_options(rl, report_options=False)
    rl.add_argument("--category", help="only this category")
    rl.add_argument("--kind", choices=RULE_KINDS, help="only rules of this kind")
    rs = rsub.add_parser("show", help="a rule's documentation",
                         description="A rule's page: what it detects, why, an example, the fix.")
    rs.add_argument("rule_id", metavar="ID")
    add_output_options(rs, formats=("terminal", "json", "markdown"), report_options=False)
    rt = rsub.add_parser("test", help="run every rule's examples and near misses",
                         description="Run every rule's examples and near misses (exit 1 when one fails).")
    rt.add_argument("dir", nargs="?", metavar="DIR", help="test only the rules in DIR (loaded with the built-ins)")
    add_output_options(rt, formats=("terminal", "json"), report_options=False)
    rc = rsub.add_parser("coverage", help="how many of the libraries' own messages explain recognises",
                         description="Render every relevant message of the mined catalogue (catalogue/*.toml,\n"
                                     "made by scripts/mine_catalogue.py) into a concrete log line, explain it,\n"
                                     "and count the ones whose first finding has the catalogue's category,\n"
                                     "split by whether a hand-written rule or a generated catch-all\n"
                                     "(rules/log/*/catalogue-*.toml) recognised it.",
                         formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    rc.add_argument("--catalogue", metavar="DIR", help="the catalogue folder (default: the checkout's catalogue/)")
    rc.add_argument("--misses", action="store_true", help="also list every relevant message not recognised")
    rc.add_argument("--forms", action="store_true",
                    help="also explain each message damaged as pastes are (rank prefixes, timestamps, wrapped)")
    add_output_options(rc, formats=("terminal", "json"), report_options=False)
    p.set_defaults(_rules_parser=p)


def main(args: Namespace) -> int:
    if args.rules_command is None:  # `mpdoctor rules` alone: its help, as an error
        args._rules_parser.print_help(sys.stderr)
        return 2
    rules = load_rules_or_fail(args.rules)
    if isinstance(rules, int):
        return rules
    if args.rules_command == "list":
        return _rules_list(rules, args)
    if args.rules_command == "show":
        return _rules_show(rules, args)
    if args.rules_command == "coverage":
        return _rules_coverage(rules, args)
    return _rules_test(rules, args)


def _write_json(data: dict[str, Any]) -> None:
    """A rule face's JSON, scrubbed as its last step (a user rule's text is the user's)."""
    import json

    from ..redact import Scrubber

    sys.stdout.write(json.dumps(Scrubber().obj(data), indent=2, ensure_ascii=False) + "\n")


def _write_text(text: str, markdown: bool = False) -> None:
    """A rule face's text, scrubbed as its last step: secrets cut, control characters
    shown rather than obeyed."""
    from ..redact import markdown_safe, scrub

    text = scrub(text)
    sys.stdout.write(markdown_safe(text) if markdown else text)


def _rules_list(rules: list[Rule], args: Namespace) -> int:
    chosen = [r for r in rules if (not args.category or r.category == args.category)
              and (not getattr(args, 'kind', None) or r.kind == args.kind)]
    chosen.sort(key=lambda r: (r.kind, r.category, r.id))
    if args.format == "json":
        _write_json({"schema": "mpdoctor.rules/1", "rules": [
            {"id": r.id, "kind": r.kind, "category": r.category, "severity": r.severity, "title": r.title,
             "path": str(r.path)} for r in chosen]})
        return EXIT_OK
    if args.format == "markdown":
        lines = ["| id | kind | category | severity | title |", "|---|---|---|---|---|"]
        for r in chosen:
            title = _placeholders(r.title).replace("|", "\\|")
            lines.append(f"| `{r.id}` | {r.kind} | `{r.category}` | {r.severity} | {title} |")
        _write_text("\n".join(lines) + "\n", markdown=True)
        return EXIT_OK
    if args.format == "oneline":
        _write_text("".join(f"{r.id} {r.kind} {r.category} {r.severity} {' '.join(_placeholders(r.title).split())}\n"
                            for r in chosen))
        return EXIT_OK
    from ..redact import scrub
    from ..render import make_console, say, wrap

    console = make_console()
    width = max(40, console.width)
    idw = max((len(r.id) for r in chosen), default=0)
    say(console, (f"{len(chosen)} rules", "bold"))
    group = None
    for r in chosen:
        if (r.kind, r.category) != group:
            group = (r.kind, r.category)
            say(console)
            say(console, (f"{r.kind} · {r.category}", "bold"))
        head = f"  {r.id:<{idw}}  {r.severity:<7}  "
        title = scrub(_placeholders(r.title))
        if len(head) + 40 <= width:  # the title beside the id, wrapped under itself
            lines = wrap(title, width, first=head)
            say(console, (lines[0][:len(head)], ""), (lines[0][len(head):], "dim"))
        else:  # the id whole on its line, the title beneath
            say(console, (f"  {r.id}  {r.severity}", ""))
            lines = [""] + wrap(title, width, indent=6)
        for line in lines[1:]:
            say(console, (line, "dim"))
    return EXIT_OK


def _placeholders(template: str) -> str:
    """A template shown as documentation: {requested} -> ⟨requested⟩ (angle brackets
    would be read as HTML by a markdown renderer, and vanish)."""
    import re

    return re.sub(r"\{(\w+)[^{}]*\}", "⟨\\1⟩", template).replace("{{", "{").replace("}}", "}")


def rule_doc_markdown(rule: Rule, rules: list[Rule] | None = None) -> str:
    """A rule's page in ruff's shape: what it detects, why it happens, known problems,
    an example (with what mpdoctor reports on it), the fix, a look-alike, references."""
    from ..engine.selftest import example_text

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
        if ex.evidence is not None:
            kind, name = ex.evidence
            what = {"snapshot": "environment snapshot", "events": "recorded run", "probe": "recorded probe mode"}[kind]
            out += [f"The {what} `{name}`.", ""]
        else:
            try:
                text = example_text(rule, ex)
            except OSError:
                text = f"(example file {ex.file} not found)"
            out += ["```text", "\n".join(text.strip("\n").split("\n")[-25:]), "```", ""]
        found = _reported(rule, ex, rules)
        if found is not None:
            out += ["mpdoctor reports:", "", f"> **{found.title}**", ">"]
            out += [f"> {found.explanation}", ""] if found.explanation else [""]
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
    produced = _facts_of(rule)
    if produced:
        out += ["## Facts", "", "What this rule's sentences can say, and where each comes from:", ""]
        out += [f"- `{name}`: {where}" for name, where in sorted(produced.items()) if not name.startswith("_")]
        out += [""]
    if rule.references:
        out += ["## References", ""] + [f"- <{r}>" for r in rule.references] + [""]
    out += [f"{len(rule.examples)} example(s), {len(rule.near_misses)} near miss(es), tested by "
            f"`mpdoctor rules test` · `{rule.path}`", ""]
    return "\n".join(out)


def _reported(rule: Rule, ex: Any, rules: list[Rule] | None) -> Any:
    """This rule's finding on its example, as the face that reads that evidence makes it."""
    from ..rulebase import case_runners

    runner = case_runners().get(rule.kind)
    try:
        found = runner(rule, ex, rules if rules is not None else [rule]) if runner else []
    except Exception:  # the page is still useful without it
        return None
    return next((f for f in found if f.rule == rule.id), None)


def _facts_of(rule: Rule) -> dict[str, str]:
    from ..rulebase import vocabulary

    try:
        return vocabulary().produced(rule)
    except Exception:  # the page is still useful without it
        return {}


def _rules_show(rules: list[Rule], args: Namespace) -> int:
    by_id = {r.id: r for r in rules}
    rule = by_id.get(args.rule_id)
    if rule is None:
        import difflib

        close = difflib.get_close_matches(args.rule_id, list(by_id), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see `mpdoctor rules list`"
        return fail(f"no rule {args.rule_id!r}{hint}")
    try:
        doc = rule_doc_markdown(rule, rules)
    except RuleError as exc:  # an example file the rule may not read (outside its folder, a device)
        return fail(f"bad rule: {exc}")
    if args.format == "json":
        _write_json({"schema": "mpdoctor.rule/1", "id": rule.id, "kind": rule.kind, "category": rule.category,
                     "severity": rule.severity, "title": rule.title, "doc": rule.doc,
                     "fixes": rule.fixes, "references": rule.references,
                     "facts": _facts_of(rule), "path": str(rule.path)})
    elif args.format == "markdown":
        _write_text(doc, markdown=True)
    else:
        from rich.markdown import Markdown

        from ..redact import scrub
        from ..render import make_console, print_unpadded

        print_unpadded(make_console(), Markdown(scrub(doc)))
    return EXIT_OK


def _rules_test(rules: list[Rule], args: Namespace) -> int:
    from ..engine.selftest import run_selftest

    only = None
    if args.dir:
        try:
            from pathlib import Path

            from ..rulebase import load_folder

            extra = load_folder(Path(args.dir))
        except RuleError as exc:
            return fail(f"bad rule: {exc}")
        ids = {r.id for r in extra}
        rules = [r for r in rules if r.id not in ids] + extra
        only = extra
    from ..rulebase import case_runners

    results = run_selftest(rules, case_runners(), only)
    failed = [r for r in results if not r.ok]
    tested = len({r.rule for r in results})
    cases = [r for r in results if r.kind not in ("sentence", "pattern")]  # coverage checks are no cases
    failed_cases = [r for r in cases if not r.ok]
    unsaid = [r for r in results if r.kind == "sentence" and not r.ok]
    if args.format == "json":
        _write_json({"schema": "mpdoctor.rules-test/1", "rules": tested, "cases": len(cases), "failed": [
            {"rule": r.rule, "case": f"{r.kind}[{r.index}]" if r.kind not in ("sentence", "pattern") else r.kind + "s",
             "message": r.message} for r in failed]})
    else:
        lines = []
        for r in failed:
            case = f"{r.kind}[{r.index}]" if r.kind not in ("sentence", "pattern") else r.kind + "s"
            lines.append(f"FAIL {r.rule} {case}: {r.message}")
        summary = f"{tested} rules, {len(cases)} cases: {len(cases) - len(failed_cases)} passed, {len(failed_cases)} failed"
        if unsaid:
            summary += f"; {len(unsaid)} rule(s) with a sentence no example renders"
        unmatched = [r for r in results if r.kind == "pattern" and not r.ok]
        if unmatched:
            summary += f"; {len(unmatched)} rule(s) with a pattern no example matches"
        _write_text("\n".join(lines + [summary]) + "\n")
    return EXIT_ERROR_FINDING if failed else EXIT_OK


# --- coverage of the mined message catalogue (catalogue/*.toml) --------------------------------

# A placeholder's value is chosen by the words just before it (the last that matches wins).
_FILL = [
    (r"", "4"),
    (r"(?i)(?:dtype|type|scalar type|precision)\W{0,3}$", "torch.float16"),
    (r"(?i)(?:device|on|to)\W{0,3}$", "cuda:0"),
    (r"(?i)(?:rank|ranks|world size|world_size)\W{0,3}$", "1"),
    (r"(?i)(?:version|torch|>=|==)\W{0,3}$", "2.1.0"),
    (r"(?i)(?:name|module|layer|parameter|param|key|attribute|argument)\W{0,3}$", "weight"),
    (r"(?i)(?:mixed_precision|mode)\W{0,3}$", "fp16"),
    (r"(?i)(?:backend)\W{0,3}$", "nccl"),
    (r"(?i)(?:shape|size|sizes)\W{0,3}$", "[4, 4096]"),
    (r"(?i)(?:capability)\W{0,3}$", "7.5"),
    (r"(?i)(?:flash attention|flash_attention_|FlashAttention)\W{0,3}$", "2"),
    (r"(?i)\bd(?:t)?ype\b[^{}]{0,30}\b(?:is|was|got|found)\W{0,3}$", "torch.float32"),
    (r"(?i)\bd(?:t)?ype in\W{0,3}$", "LlamaForCausalLM"),
]
# a named placeholder the miner wrote itself ({host}:{pid}:{tid} [{dev}] NCCL WARN, NCCL's {file}:{line})
_NAMED = {"host": "gpu-node-3", "pid": "48211", "tid": "48377", "dev": "0", "file": "/pytorch/torch/csrc/"
          "distributed/c10d/NCCLUtils.cpp", "line": "77", "version": "2.21.5"}
# The damaged forms a paste of the message takes, each one the normaliser reads back
# (mpdoctor/logs/normalize.py): "plain" is the message as the library prints it.
FORMS = ("plain", "rank", "timestamp", "wrapped")


def render_template(template: str, kind: str, form: str = "plain") -> str:
    """A mined template as a user's log would show it: its placeholders filled with
    plausible values, the exception's (or warning's) name in front, in one of FORMS:
    every line behind torchrun's "[rank1]: ", behind a logging timestamp, or the
    message folded as rich prints it (after a traceback box, or behind RichHandler)."""
    import re

    out, pos = [], 0
    for m in re.finditer(r"\{[^{}]{0,60}\}", template):
        before = template[max(0, m.start() - 40):m.start()]
        value = _NAMED.get(m.group(0)[1:-1], "")
        if not value:
            value = "4"
            for rx, v in _FILL:
                if re.search(rx, before):
                    value = v
        out.append(template[pos:m.start()] + value)
        pos = m.end()
    text = "".join(out) + template[pos:]
    exception = kind not in ("warning", "log-error") and not kind.endswith("Warning")
    if kind in ("warning", "log-error"):
        text = f"/usr/lib/python3/site-packages/lib/module.py:42: UserWarning: {text}" if kind == "warning" else text
    elif kind.endswith("Warning"):
        text = f"/usr/lib/python3/site-packages/lib/module.py:42: {kind}: {text}"
    if form == "wrapped":
        return _rich_wrapped(f"{kind}: {text}" if exception else text, exception)
    if exception:
        text = f"Traceback (most recent call last):\n  File \"train.py\", line 10, in <module>\n    main()\n{kind}: {text}"
    if form == "rank":
        return "\n".join("[rank1]: " + line for line in text.splitlines())
    if form == "timestamp":
        return "\n".join(f"2026-03-04 12:{i % 60:02d}:07,512 - ERROR - {line}" for i, line in enumerate(text.splitlines()))
    return text


def _rich_wrapped(text: str, exception: bool, width: int = 80) -> str:
    """The message as rich prints it in a terminal: an exception after its traceback box,
    folded at the box's width; a logged line behind RichHandler's time and level, folded
    with its continuation lines under the message's first column."""
    import textwrap

    if exception:
        title = " Traceback (most recent call last) "
        side = (width - 2 - len(title)) // 2
        top = "╭" + "─" * side + title + "─" * (width - 2 - side - len(title)) + "╮"
        body = [f"│ {line:<{width - 4}} │" for line in ("/home/user/train.py:10 in <module>", "", "❱ 10 │   main()")]
        return "\n".join([top, *body, "╰" + "─" * (width - 2) + "╯", *textwrap.wrap(text, width)])
    head = "[12:00:07] WARNING  "
    lines = textwrap.wrap(text, width - len(head))
    return "\n".join([head + lines[0], *(" " * len(head) + line for line in lines[1:])])


def catalogue_dir(path: "str | None" = None) -> Any:
    from pathlib import Path

    return Path(path) if path else Path(__file__).resolve().parents[2] / "catalogue"


def load_catalogue(folder: Any) -> list[dict[str, str]]:
    """Every message of catalogue/<library>.toml, with its library and version."""
    import tomllib

    out = []
    for p in sorted(folder.glob("*.toml")):
        if p.name == "review.toml":
            continue
        data = tomllib.loads(p.read_text(encoding="utf-8"))
        for m in data.get("message", []):
            out.append({**m, "library": data["library"], "version": data["version"]})
    return out


def judge(message: dict[str, str], rules: list[Rule], form: str = "plain") -> tuple[bool, str, str]:
    """(recognised, the top finding's category or '-', its rule id or '-'): recognised when
    explain's first finding on the rendered message has the catalogue's category."""
    from ..logs.explain import explain_text

    report = explain_text(render_template(message["template"], message["kind"], form), rules)
    if not report.findings:
        return False, "-", "-"
    top = report.findings[0]
    return top.category == message["category"], top.category, top.rule


def judge_message(message: dict[str, str], rules: list[Rule]) -> tuple[bool, str]:
    ok, top, _rule = judge(message, rules)
    return ok, top


def catch_all(rule_id: str) -> bool:
    """A rule scripts/mine_catalogue.py --rules generated, quoting the messages no
    hand-written rule knows (rules/log/<category>/catalogue-*.toml)."""
    return rule_id.startswith("catalogue-")


def _rules_coverage(rules: list[Rule], args: Namespace) -> int:
    folder = catalogue_dir(args.catalogue)
    if not folder.is_dir():
        return fail(f"no catalogue folder at {folder} (made by scripts/mine_catalogue.py in a checkout)")
    try:
        messages = [m for m in load_catalogue(folder) if m["category"] != "not ours"]
    except (OSError, ValueError, KeyError) as exc:
        return fail(f"bad catalogue in {folder}: {exc}")
    log_rules = [r for r in rules if r.kind == "log"]
    forms = FORMS if getattr(args, "forms", False) else ("plain",)
    # each row: [by a hand-written rule, by a generated catch-all, relevant]
    by_lib: dict[str, list[int]] = {}
    by_cat: dict[str, list[int]] = {}
    by_form: dict[str, list[int]] = {}
    misses = []
    for m in messages:
        for form in forms:
            ok, top, rule_id = judge(m, log_rules, form)
            keys = [(by_form, form)]
            if form == "plain":
                keys += [(by_lib, m["library"]), (by_cat, m["category"])]
            for table, key in keys:
                row = table.setdefault(key, [0, 0, 0])
                row[1 if ok and catch_all(rule_id) else 0] += ok
                row[2] += 1
            if not ok and form == "plain":
                misses.append({**m, "top": top})
    versions = {m["library"]: m["version"] for m in messages}
    hand = sum(r[0] for r in by_lib.values())
    gen = sum(r[1] for r in by_lib.values())
    total = len(messages)

    def rows(table: dict[str, list[int]]) -> dict[str, dict[str, int]]:
        return {k: {"recognised": a + b, "by_hand_written_rule": a, "by_catch_all": b, "relevant": n}
                for k, (a, b, n) in sorted(table.items())}

    if args.format == "json":
        _write_json({"schema": "mpdoctor.rules-coverage/2", "recognised": hand + gen, "relevant": total,
                     "by_hand_written_rule": hand, "by_catch_all": gen,
                     "libraries": {k: {**v, "version": versions[k]} for k, v in rows(by_lib).items()},
                     "categories": rows(by_cat), "forms": rows(by_form),
                     "misses": [{k: m[k] for k in ("library", "category", "template", "source", "top")}
                                for m in misses] if args.misses else []})
        return EXIT_OK

    def table(title: str, t: dict[str, list[int]], label=lambda k: k) -> list[str]:
        lines = [f"{title:<46} {'recognised':>16} {'hand-written':>13} {'catch-all':>10}"]
        for k, (a, b, n) in sorted(t.items()):
            lines.append(f"  {label(k)[:44]:<44} {a + b:>5} / {n:<5} {100 * (a + b) / n:5.1f}% "
                         f"{100 * a / n:12.1f}% {100 * b / n:9.1f}%")
        return lines

    lines = table("per library", by_lib, lambda k: f"{k} {versions[k]}") + table("per category", by_cat)
    if len(forms) > 1:
        lines += table("per form (the same messages, damaged as pastes are)", by_form)
    pct = 100 * (hand + gen) / total if total else 100.0
    lines.append(f"recognised {hand + gen} / {total} relevant templates ({pct:.1f}%): "
                 f"{hand} by a hand-written rule ({100 * hand / max(total, 1):.1f}%), "
                 f"{gen} only by a generated catch-all quoting the message ({100 * gen / max(total, 1):.1f}%)")
    if args.misses:
        lines.append("not recognised:")
        lines += [f"  [{m['library']}] {m['category']} (top: {m['top']}): {m['template'][:160]}  ({m['source']})"
                  for m in misses]
    _write_text("\n".join(lines) + "\n")
    return EXIT_OK
