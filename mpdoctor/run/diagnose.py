"""The parent side of `mpdoctor run`: the child's output and the instrumentation's
recorded events, judged by the rule base, merged root cause first. No torch here."""

from __future__ import annotations

import sys
from typing import Any

from ..findings import Evidence, Finding, Report, rank_findings


def diagnose(cmd: list[str], result: Any, records: list[Any], rules: list[Any] | None = None) -> Report:
    from ..instrument.diagnose import findings_for

    ranked = [r for r in records if r.snapshot or r.exceptions or r.internal_errors]
    multi = len({r.rank for r in ranked if r.rank is not None}) > 1
    inst: list[Finding] = []
    for rec in ranked:
        snap = dict(rec.snapshot)
        snap["internal_errors"] = list(dict.fromkeys((snap.get("internal_errors") or []) + rec.internal_errors))
        for f in findings_for(snap):
            if rec.rank is not None and multi:
                f.ranks = [rec.rank]
                f.facts.setdefault("rank", rec.rank)
            inst.append(f)
    inst = _merge_same(inst)
    trouble = result.exit_code != 0 or any(f.severity != "info" for f in inst)
    findings: list[Finding] = []
    unrecognised: list[Any] = []
    text = result.tail.text()
    if trouble:
        try:
            from ..explain import explain_text

            explained = explain_text(text, rules)
            findings, unrecognised = list(explained.findings), list(explained.unrecognised)
        except Exception as exc:  # a broken rule must not hide what the instrumentation saw
            sys.stderr.write(f"mpdoctor run: the explain rules failed on the output: {type(exc).__name__}: {exc}\n")
    findings = _merge_into(findings, inst)
    if result.signal_name == "SIGKILL" and not any(f.category == "host-out-of-memory" for f in findings) \
            and "Traceback (most recent call last)" not in text:
        findings.append(_sigkill_finding(result))
    ranks = rank_summary(ranked) if multi else []
    if ranks:
        findings.append(_rank_finding(ranks))
    plan = next((r.snapshot.get("plan") for r in ranked if r.snapshot.get("plan")), None)
    if trouble and plan:
        from ..instrument.diagnose import plan_summary_finding

        findings.append(plan_summary_finding(plan))
    extra: dict[str, Any] = {"exit_code": result.exit_code, "command": cmd}
    if result.signal_name:
        extra["signal"] = result.signal_name
    if ranks:
        extra["ranks"] = ranks
    if plan:
        extra["precision_plan"] = plan
    info = {"bytes": result.tail.total, "wall_s": round(result.wall_s, 3), "instrumented": bool(records) or None}
    return Report(findings=rank_findings(findings), unrecognised=unrecognised, extra=extra,
                  input={k: v for k, v in info.items() if v is not None})


def _key(f: Finding) -> tuple:
    return (f.rule, f.category, f.facts.get("module"), f.facts.get("phase"), f.facts.get("step"))


def _merge_same(findings: list[Finding]) -> list[Finding]:
    """One finding per (rule, module, phase, step) across ranks, counted."""
    out: dict[tuple, Finding] = {}
    for f in findings:
        k = _key(f)
        if k in out:
            have = out[k]
            have.count += f.count
            have.ranks = sorted(set(have.ranks) | set(f.ranks))
            have.facts.pop("rank", None)
        else:
            out[k] = f
    return list(out.values())


def _merge_into(explained: list[Finding], inst: list[Finding]) -> list[Finding]:
    """An instrumentation finding of the same category as a log finding sharpens it (the
    log knows the message and the fix; the instrumentation knows the module and step)."""
    out = list(explained)
    taken: set[int] = set()
    for f in inst:
        target = next((e for e in explained if e.category == f.category and e.severity == "error"
                       and f.severity == "error" and id(e) not in taken), None)
        if target is None:
            out.append(f)
            continue
        taken.add(id(target))
        target.priority = max(target.priority, f.priority)
        target.consequence = target.consequence and f.consequence
        for k, v in f.facts.items():
            target.facts.setdefault(k, v)
        target.evidence.extend(f.evidence)
        target.ranks = sorted(set(target.ranks) | set(f.ranks))
        module = f.facts.get("module")
        if module and module not in target.title:
            where = ", ".join(str(x) for x in (f.facts.get("phase"), f"step {f.facts['step']}"
                                               if f.facts.get("step") is not None else None) if x)
            target.title += f" — in `{module}`" + (f" ({where})" if where else "")
        # the instrumentation's fixes that name the module are the most specific ones
        local = [x for x in f.fixes if module and f"`{module}`" in x and x not in target.fixes]
        target.fixes = local + target.fixes
        if f.explanation and f.explanation not in target.explanation:
            target.explanation = (f.explanation + " " + target.explanation).strip()
    return out


def _sigkill_finding(result: Any) -> Finding:
    return Finding(
        rule="run-killed-sigkill", category="host-out-of-memory", severity="error",
        title="The command was killed by SIGKILL with no traceback: most likely the host's out-of-memory killer",
        explanation="A process killed by SIGKILL cannot print anything. With no traceback before it, the usual "
                    "sender is the kernel's OOM killer (host RAM exhausted, often by data loading or by loading a "
                    "checkpoint on every rank at once); a scheduler's time or memory limit is the other one.",
        fixes=["Check `dmesg | grep -i -E 'killed process|out of memory'` (or `journalctl -k`) for the OOM killer.",
               "Lower host memory use: fewer DataLoader workers, `low_cpu_mem_usage=True` / loading on one rank, "
               "a smaller batch."],
        evidence=[Evidence(text=f"exit status {result.exit_code} (killed by SIGKILL), "
                                f"{result.tail.total} bytes of output, no traceback", source="run")],
        facts={"signal": "SIGKILL", "exit_code": result.exit_code}, priority=45)


def rank_summary(records: list[Any]) -> list[dict[str, Any]]:
    """Per rank: what it did at the end — failed (first or later), timed out, waited and
    was killed, was killed, or finished."""
    ranks = [r for r in records if r.rank is not None]
    failures = sorted((r.first_exception["time"], r.rank) for r in ranks if r.first_exception)
    first_rank = failures[0][1] if failures else None
    out = []
    for r in sorted(ranks, key=lambda x: x.rank):
        exc = r.first_exception
        prog = r.progress or {}
        step = prog.get("step", (r.snapshot or {}).get("step"))
        where = prog.get("where")
        entry: dict[str, Any] = {"rank": r.rank, "pid": r.pid, "step": step}
        if exc is not None:
            text = exc.get("exception", "")
            if any(w in text for w in ("timed out", "Timeout", "timeout")):
                status = "timed out"
            elif any(w in text for w in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                         "NCCL communicator was aborted")):
                status = "lost its peer"
            else:
                status = "failed first" if r.rank == first_rank else "failed"
            if status in ("timed out", "lost its peer") and where:
                status = f"waited in {where.removeprefix('in ')} and {status}"
            entry["status"] = status + (" and was killed" if r.exit is None else "")
            entry["exception"] = text
            if exc.get("module"):
                entry["module"] = exc["module"]
        elif r.exit is not None:
            entry["status"] = "finished"
        elif where and where.startswith("in "):
            entry["status"] = f"waited in {where[3:]} and was killed"
        else:
            entry["status"] = "was killed" + (f" during {where}" if where else "")
        out.append(entry)
    return out


def _rank_finding(ranks: list[dict[str, Any]]) -> Finding:
    parts = []
    for r in ranks:
        s = f"rank {r['rank']} {r['status']}"
        if r.get("step") is not None and r["step"] >= 0:
            s += f" at step {r['step']}"
        if r.get("exception"):
            s += f" ({r['exception'][:120]}" + (f", in `{r['module']}`" if r.get("module") else "") + ")"
        parts.append(s)
    first = next((r for r in ranks if r["status"] == "failed first"), None)
    head = [f"Rank {first['rank']} failed first" + (f" in `{first['module']}`" if first.get("module") else "")
            + (f" at step {first['step']}" if first.get("step") is not None else "")] if first else []
    title = "; ".join(head + [f"rank {r['rank']} {r['status']}" for r in ranks if r is not first])
    return Finding(rule="run-rank-summary", category="distributed-communication", severity="info",
                   title=title, explanation="; ".join(parts) + ".",
                   evidence=[Evidence(text=p, source="instrument") for p in parts],
                   facts={"first_failed_rank": first["rank"] if first else None, "ranks": len(ranks)},
                   consequence=True, priority=5)
