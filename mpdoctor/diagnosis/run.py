"""The parent side of `mpdoctor run`: the run's evidence judged by the rule base.

Four kinds of knowledge meet here, all from rules/ through the one assembler:
- the log rules over the command's output (what `mpdoctor explain` would say on it);
- the log rules over each exception a process recorded, with the context the
  instrumentation saw (the module, its parameters and inputs, autocast, memory) as
  extra facts: the rule base explains the message, the run says where;
- the env rules over the environment each process really ran in (its torch, its
  Accelerator's precision, its device), with what it observed (the first matmul's
  dtype): fp16 on a CPU is the same finding in `check` and in `run`;
- the run rules over the recorded events (non-finite values, the loss scaler, the
  precision plan, the ranks).
Findings of one cause are merged (engine.assemble.merge_findings), superseded generic
ones dropped, and the rest ranked root cause first. No torch here.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..engine.assemble import conclude
from ..engine.judge import checks_of, judge_rules
from ..engine.rule import Rule
from ..findings import Finding, Report, Unrecognised
from ..redact import clip
from ..run.checks import outcome, plan, recipe, values
from ..run.evidence import RunView, build_evidence, origin_facts, read_evidence
from .sharpen import asked_precision

_MODES = ("no", "fp16", "bf16", "fp8")
def _run_checks() -> dict[str, Any]:
    return checks_of(values, plan, recipe, outcome)


def diagnose(cmd: list[str], result: Any, records: list[Any], rules: list[Rule]) -> Report:
    """The report of one wrapped run (result: run.wrapper.ChildResult; records: the
    processes' instrument.events.RankRecord)."""
    evidence = build_evidence(cmd, result, records)
    save = os.environ.get("MPDOCTOR_SAVE_EVENTS")
    if save:
        try:
            # a file mpdoctor writes: no secret in it
            from ..redact import redact_record

            with open(save, "w", encoding="utf-8") as fh:
                json.dump(redact_record(evidence), fh, indent=1, default=str)
        except OSError as exc:
            sys.stderr.write(f"mpdoctor run: cannot write MPDOCTOR_SAVE_EVENTS={save}: {exc.strerror}\n")
    report = judge_run(evidence, rules, output=result.tail.text() if result is not None else "")
    report.input = {k: v for k, v in {"bytes": result.tail.total, "wall_s": round(result.wall_s, 3),
                                       "instrumented": bool(records) or None}.items() if v is not None}
    return report


def judge_run(evidence: dict[str, Any], rules: list[Rule], output: str = "",
              observed: dict[str, Any] | None = None, requested_from: str = "the Accelerator of this run") -> Report:
    """The run's evidence judged by every kind of rule. `output`: what the command
    printed (the log rules read it); `observed`: facts another face measured about this
    run (the probe's speed-up) for the env rules."""
    by_id = {r.id: r for r in rules}
    view = RunView(evidence)
    findings: list[Finding] = []
    unrecognised: list[Unrecognised] = []

    if output.strip():
        explained = _explain_output(output, rules, _case_facts(view))
        findings += explained.findings
        unrecognised += explained.unrecognised

    exc_findings, exc_unknown = _exception_findings(view, rules)
    findings += exc_findings
    findings += _env_findings(view, rules, observed, requested_from, asked_precision(findings))
    run_rules = [r for r in rules if r.kind == "run"]
    findings += [f for o in judge_rules(view, run_rules, _run_checks()) for f in o.findings]

    findings = conclude(findings, by_id, same_sighting=True)
    # an exception the output already showed unrecognised is one entry, now with its module
    known = {u.exception.split(":")[0] + ":" + u.exception.split(":", 1)[-1][:60] for u in unrecognised}
    for u in exc_unknown:
        key = u.exception.split(":")[0] + ":" + u.exception.split(":", 1)[-1][:60]
        if key in known:
            for have in unrecognised:
                if have.exception.split(":")[0] + ":" + have.exception.split(":", 1)[-1][:60] == key:
                    have.user_frame = have.user_frame or u.user_frame
            continue
        unrecognised.append(u)
        known.add(key)

    # Ctrl-C is the user's doing: neither an error to recognise nor, by itself, trouble
    # (an interrupted run reports what it saw, once)
    unrecognised = [u for u in unrecognised if not _interruption(u.exception)]
    interrupted = view.signal == "SIGINT" or any(_interruption(str(e.get("exception") or ""))
                                                  for p in view.watched for e in p.exceptions)
    trouble = (view.exit_code != 0 and not interrupted) or any(f.severity != "info" and not _quiet(f, by_id)
                                                               for f in findings)
    if not trouble:  # the run went well: its summaries are not news
        findings = [f for f in findings if not (f.rule in by_id and by_id[f.rule].only_in_trouble)]
    extra: dict[str, Any] = {"exit_code": view.exit_code, "command": evidence.get("command") or []}
    if view.signal:
        extra["signal"] = view.signal
    if view.multi_rank:
        extra["ranks"] = _said_ranks(outcome.rank_story(view), by_id.get("rank-summary"))
    if view.plan:
        extra["precision_plan"] = view.plan
    report = Report(findings=findings, unrecognised=unrecognised, extra=extra)
    report.quiet_rules = {r.id for r in rules if r.quiet}
    return report


# Up to this much output is explained whole; more (a chatty training prints a line per
# step) only in the regions around what a rule or a traceback could start at, as
# `explain` reads a big log (logs.regions.RegionScanner): the same findings, a fraction of the time.
WHOLE_OUTPUT = 256 * 1024


def _case_facts(view: RunView) -> dict[str, Any]:
    """What makes a log rule's fix fit this run (engine/derive/fit.py reads them): the
    device type it trained on, the transformers it had installed. Helpers (`_`): never
    in a finding's JSON."""
    p = view.main
    if p is None:
        return {}
    out: dict[str, Any] = {}
    device = str((p.plan or {}).get("device") or "").split(":")[0]
    torch_env = (p.env or {}).get("torch") or {}
    if not device and torch_env.get("cuda_available") is False and not (torch_env.get("mps") or {}).get("available"):
        device = "cpu"
    if device:
        out["_run_device"] = device
    version = (((p.env or {}).get("packages") or {}).get("versions") or {}).get("transformers")
    if version:
        out["_run_transformers"] = str(version)
    return out


def _explain_output(output: str, rules: list[Rule], case: dict[str, Any] | None = None) -> Report:
    from ..logs import explain_lines, explain_text, looks_binary, prefilter_for
    from ..logs.regions import RegionScanner

    if len(output) <= WHOLE_OUTPUT:
        return explain_text(output, rules, case)
    if looks_binary(output[-65536:].encode("utf-8", "replace")):
        return Report(findings=[])  # it ends in data (`tar c . | ...`), not in a log to explain
    from ..logtext import normalise

    scanner = RegionScanner(prefilter_for(rules))
    scanner.feed(output.encode("utf-8", "surrogateescape"))
    lines = []
    for first_no, region in scanner.finish():
        lines.extend(normalise(region.decode("utf-8", "replace"), first_no))
    return explain_lines(lines, rules, case)


def _said_ranks(story: list[dict[str, Any]], rule: Rule | None) -> list[dict[str, Any]]:
    """The ranks' records for the JSON, each status in the rank-summary rule's words."""
    if rule is None:
        return story
    from ..engine.assemble import apply_words

    out = []
    for r in story:
        said = apply_words(rule, dict(r))
        status = said.get("status") or r.get("status")
        if said.get("killed"):
            status += said["killed"]
        out.append({k: v for k, v in {**r, "status": status}.items() if k not in ("killed", "when", "waited_in",
                                                                                     "during")})
    return out


def _interruption(exception: str) -> bool:
    """Whether an exception's text names a KeyboardInterrupt (Ctrl-C)."""
    return exception.split(":", 1)[0].strip().rsplit(".", 1)[-1] == "KeyboardInterrupt"


def _quiet(f: Finding, by_id: dict[str, Rule]) -> bool:
    rule = by_id.get(f.rule)
    return bool(rule and rule.quiet)


def _exception_findings(view: RunView, rules: list[Rule]) -> tuple[list[Finding], list[Unrecognised]]:
    """Each distinct exception a process recorded, explained by the log rules with the
    instrumentation's context as extra facts."""
    from ..logs import explain_text

    findings: list[Finding] = []
    unknown: list[Unrecognised] = []
    seen: set[str] = set()
    for p in view.watched:
        # the watcher's raised errors carry the whole message and its context; the
        # exception events (what a rank was doing when it died) are the fallback
        for exc in (p.watch.get("errors") or p.exceptions):
            text = str(exc.get("exception") or "").strip()
            if not text:
                continue
            key = f"{p.rank}|{text[:300]}"
            if key in seen:
                continue
            seen.add(key)
            context = {**_case_facts(view), **_context_facts(exc)}
            report = explain_text(text, rules, extra_facts=context)
            for f in report.findings:
                f.evidence.append(_context_evidence(exc, p.path))
                if view.multi_rank and p.rank is not None:
                    f.ranks = sorted(set(f.ranks) | {p.rank})
                findings.append(f)
            if not report.findings:
                first = clip(text.split("\n")[0], 400)
                where = f"in `{exc['module']}` at step {exc.get('step')}" if exc.get("module") else None
                unknown.append(Unrecognised(first, 0, where, ranks=[p.rank] if view.multi_rank and p.rank is not None
                                            else []))
    return findings, unknown


def _context_facts(exc: dict[str, Any]) -> dict[str, Any]:
    ctx = exc.get("context") or {}
    params = ", ".join(f"{n}× {k}" for k, n in (ctx.get("params") or {}).items())
    inputs = "; ".join(f"{i.get('dtype')} {i.get('device')} {tuple(i.get('shape') or [])}"
                       for i in ctx.get("inputs") or [])
    ac = ctx.get("autocast")
    autocast = ", ".join(f"{d}: {dt}" for d, dt in ac.items()) if isinstance(ac, dict) and ac else "off"
    mem = ctx.get("memory") or {}
    memory = _memory_words(mem)
    facts = {"module": exc.get("module") or None, "module_type": exc.get("module_type") or None,
             "step": exc.get("step"), "phase": "forward" if exc.get("module") else None,
             "param_dtypes": params or None, "input_dtypes": inputs or None,
             "autocast": autocast if exc.get("module") else None, "memory_context": memory or None,
             "batch_shape": str(tuple(ctx["batch_shape"])) if ctx.get("batch_shape") else None}
    facts.update(origin_facts(exc))  # the odd tensor and what made it (instrument/origin.py)
    return {k: v for k, v in facts.items() if v is not None}


def _memory_words(mem: dict[str, Any]) -> str:
    parts = []
    dev = mem.get("device") or {}
    if dev.get("allocated"):
        parts.append(f"device {dev.get('device')}: allocated {dev['allocated']}, reserved {dev.get('reserved')}, "
                     f"peak {dev.get('peak_allocated')}, free {dev.get('free')} of {dev.get('total')}")
        if dev.get("largest_allocations"):
            parts.append("largest allocations " + ", ".join(dev["largest_allocations"]))
    host = mem.get("host") or {}
    if host.get("vmrss"):
        parts.append(f"process RSS {host.get('vmrss')} (peak {host.get('vmhwm', '?')}), machine "
                     f"{host.get('memavailable', '?')} available of {host.get('memtotal', '?')}")
    return "; ".join(parts)


def _context_evidence(exc: dict[str, Any], path: str) -> Any:
    from ..findings import Evidence

    ctx = _context_facts(exc)
    if exc.get("module"):
        text = (f"{exc['module']} (step {exc.get('step')}): params [{ctx.get('param_dtypes', 'none')}] · inputs "
                f"[{ctx.get('input_dtypes', 'none')}] · autocast {ctx.get('autocast', 'off')}")
    else:
        step = exc.get("step")
        text = "outside any module" + (f" (step {step})" if isinstance(step, int) and step >= 0
                                       else " (before the first step)" if step is not None else "")
    if ctx.get("memory_context"):
        text += f" · {ctx['memory_context']}"
    return Evidence(text=clip(text, 400), source="instrument")


def _env_findings(view: RunView, rules: list[Rule], extra: dict[str, Any] | None = None,
                  requested_from: str = "the Accelerator of this run", asked: str | None = None) -> list[Finding]:
    """The env rules over the environment the main process ran in, with what it did
    (`asked`: the precision the run's failure names, when its plan has none)."""
    p = view.main
    if p is None or not p.env:
        return []
    from ..env import SnapshotError, load_snapshot_data
    from ..env.judge import judge

    try:
        snapshot = load_snapshot_data({"schema": 1, **p.env}, live=True)  # odd values nulled, not refused
    except SnapshotError:
        return []
    plan = p.plan
    requested = plan.get("requested") or asked
    observed = {"observed_dtype": plan.get("autocast_dtype"), "observed_module": plan.get("autocast_module"),
                "observed_device": plan.get("device"),
                "requested_by": requested_from if requested else None, **(extra or {})}
    report = judge(snapshot, mixed_precision=requested if requested in _MODES else None, rules=rules,
                   source=f"{p.path}.env", observed={k: v for k, v in observed.items() if v},
                   requested_from=requested_from)
    return report.findings


def events_case(path: str, rules: list[Rule]) -> list[Finding]:
    """How `rules test` judges an example that is a run's recorded evidence."""
    return judge_run(read_evidence(path), rules).findings
