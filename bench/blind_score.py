"""Score `mpdoctor explain` on a blind set of real pasted logs.

    python bench/blind_score.py DIR [--json OUT]

DIR holds the logs and a MANIFEST.toml in the project's format (the same as
fixtures/logs/real/MANIFEST.toml):

    [[log]]
    file = "oom-hip-rocm-mi250.log"
    source = "https://github.com/owner/repo/issues/1234"
    category = "out-of-memory"     # or "none" for a look-alike
    hard = "platform:hip"          # optional, several joined by ","
    note = "..."

What it measures (the same check as tests/test_real_logs.py, without asserting):

* an error paste is right when the top finding's category equals its label;
* a look-alike (category "none") is a false alarm when any finding has severity "error".

It prints top-1 accuracy on the error pastes, per category, per `hard` class, the
false-alarm rate on the look-alikes, and every miss with what mpdoctor said instead
(its top 3 findings as (severity, category, rule), or "silent"). Standard library only,
plus mpdoctor itself; which mpdoctor is scored is whatever `import mpdoctor` finds
(PYTHONPATH decides), and the script says which one it imported.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
import traceback
from collections import defaultdict
from pathlib import Path


def _load_mpdoctor():
    import importlib

    import mpdoctor
    from mpdoctor.logs import explain_path

    # load_rules lives in mpdoctor.engine.rules; later layouts moved it.
    load_rules = None
    for name in ("mpdoctor.engine.rules", "mpdoctor.engine.loader", "mpdoctor.rulebase"):
        try:
            load_rules = getattr(importlib.import_module(name), "load_rules")
            break
        except (ImportError, AttributeError):
            continue
    if load_rules is None:
        raise ImportError("no load_rules in this mpdoctor")

    return mpdoctor, load_rules, explain_path


def _top(findings, n=3):
    return [(f.severity, f.category, f.rule) for f in findings[:n]]


def _pct(right: int, n: int) -> str:
    return f"{right}/{n} ({100.0 * right / n:.1f}%)" if n else "0/0 (-)"


def score(directory: Path) -> dict:
    mpdoctor, load_rules, explain_path = _load_mpdoctor()
    manifest = tomllib.loads((directory / "MANIFEST.toml").read_text(encoding="utf-8"))["log"]
    rules = load_rules()

    results = []
    for entry in manifest:
        path = directory / entry["file"]
        hard = [h.strip() for h in entry.get("hard", "").split(",") if h.strip()]
        row = {
            "file": entry["file"],
            "source": entry.get("source", ""),
            "label": entry["category"],
            "hard": hard,
        }
        try:
            report = explain_path(path, rules)
            findings = list(report.findings)
            row["top"] = [list(t) for t in _top(findings)]
            row["errors"] = [[f.category, f.rule] for f in findings if f.severity == "error"]
            row["unrecognised"] = [u.exception for u in getattr(report, "unrecognised", [])][:3]
            if entry["category"] == "none":
                row["ok"] = not row["errors"]
            else:
                row["ok"] = bool(findings) and findings[0].category == entry["category"]
        except Exception as exc:  # a crash is a miss, reported with its reason
            row["top"] = []
            row["errors"] = []
            row["unrecognised"] = []
            row["ok"] = False
            row["crash"] = f"{type(exc).__name__}: {exc}"
            row["crash_trace"] = traceback.format_exc(limit=3)
        results.append(row)

    errors = [r for r in results if r["label"] != "none"]
    lookalikes = [r for r in results if r["label"] == "none"]

    per_category: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in errors:
        per_category[r["label"]][0] += 1
        per_category[r["label"]][1] += int(r["ok"])

    # Hard classes: each tag ("platform:hip"), each family ("platform"), and the
    # error pastes with no tag at all ("(plain)").
    per_hard: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in errors:
        keys = set()
        for tag in r["hard"]:
            keys.add(tag)
            keys.add(tag.split(":", 1)[0] + ":*")
        keys.add("(any hard)" if r["hard"] else "(plain)")
        for k in keys:
            per_hard[k][0] += 1
            per_hard[k][1] += int(r["ok"])

    per_hard_none: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in lookalikes:
        for k in set(r["hard"]) | {"(any hard)" if r["hard"] else "(plain)"}:
            per_hard_none[k][0] += 1
            per_hard_none[k][1] += int(not r["ok"])

    summary = {
        "mpdoctor": str(Path(mpdoctor.__file__).resolve().parent),
        "rules": len(rules),
        "dir": str(directory),
        "errors": {"n": len(errors), "right": sum(r["ok"] for r in errors)},
        "lookalikes": {"n": len(lookalikes), "false_alarms": sum(not r["ok"] for r in lookalikes)},
        "per_category": {k: {"n": v[0], "right": v[1]} for k, v in sorted(per_category.items())},
        "per_hard": {k: {"n": v[0], "right": v[1]} for k, v in sorted(per_hard.items())},
        "per_hard_lookalikes": {k: {"n": v[0], "false_alarms": v[1]} for k, v in sorted(per_hard_none.items())},
        "crashes": [r["file"] for r in results if "crash" in r],
        "results": results,
    }
    return summary


def render(s: dict) -> str:
    out = []
    out.append(f"mpdoctor: {s['mpdoctor']} ({s['rules']} rules)")
    out.append(f"set: {s['dir']}")
    e, l = s["errors"], s["lookalikes"]
    out.append("")
    out.append(f"top-1 accuracy on error pastes: {_pct(e['right'], e['n'])}")
    rate = (100.0 * l["false_alarms"] / l["n"]) if l["n"] else 0.0
    out.append(f"false alarms on look-alikes:    {l['false_alarms']}/{l['n']} ({rate:.1f}%)")
    if s["crashes"]:
        out.append(f"crashes: {len(s['crashes'])}: {', '.join(s['crashes'])}")

    out.append("")
    out.append("per category (n, right):")
    width = max((len(k) for k in s["per_category"]), default=10)
    for k, v in sorted(s["per_category"].items(), key=lambda kv: (-kv[1]["n"], kv[0])):
        out.append(f"  {k:<{width}}  {v['n']:>3}  {v['right']:>3}  {_pct(v['right'], v['n'])}")

    out.append("")
    out.append("per hard class, error pastes (n, right):")
    width = max((len(k) for k in s["per_hard"]), default=10)
    for k, v in sorted(s["per_hard"].items()):
        out.append(f"  {k:<{width}}  {v['n']:>3}  {v['right']:>3}  {_pct(v['right'], v['n'])}")
    if s["per_hard_lookalikes"]:
        out.append("per hard class, look-alikes (n, false alarms):")
        for k, v in sorted(s["per_hard_lookalikes"].items()):
            out.append(f"  {k:<{width}}  {v['n']:>3}  {v['false_alarms']:>3}")

    misses = [r for r in s["results"] if not r["ok"]]
    out.append("")
    out.append(f"misses ({len(misses)}):")
    for r in sorted(misses, key=lambda r: (r["label"] == "none", r["label"], r["file"])):
        hard = f" [{','.join(r['hard'])}]" if r["hard"] else ""
        if "crash" in r:
            said = f"CRASH {r['crash']}"
        elif r["label"] == "none":
            said = "error findings: " + "; ".join(f"{c} ({rule})" for c, rule in r["errors"])
        elif not r["top"]:
            said = "silent"
            if r.get("unrecognised"):
                said += " (reported as unrecognised: " + " | ".join(u[:120] for u in r["unrecognised"]) + ")"
        else:
            said = "; ".join(f"({sev}, {cat}, {rule})" for sev, cat, rule in r["top"])
        out.append(f"  {r['file']}  label={r['label']}{hard}")
        out.append(f"      said: {said}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="directory with MANIFEST.toml and the .log files")
    ap.add_argument("--json", type=Path, default=None, help="also write the full results as JSON here")
    args = ap.parse_args(argv)
    if not (args.dir / "MANIFEST.toml").is_file():
        print(f"no MANIFEST.toml in {args.dir}", file=sys.stderr)
        return 2
    s = score(args.dir)
    print(render(s))
    if args.json is not None:
        args.json.write_text(json.dumps(s, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
