"""How the run ended: a kill, each rank's story, instrumentation that stopped, OOMs caught."""

from __future__ import annotations

from typing import Any

from ...engine.judge import Hit, Result, check
from ..evidence import RunView


@check(facts=("signal", "exit_code", "output_bytes"))
def killed_without_traceback(v: RunView) -> Result:
    if v.signal != "SIGKILL" or v.output.get("traceback"):
        return []
    return [Hit({"signal": "SIGKILL", "exit_code": v.exit_code, "output_bytes": v.output.get("bytes")},
                [("exit", f"exit status {v.exit_code} (killed by SIGKILL), {v.output.get('bytes')} bytes of "
                          "output, no traceback")])]


def rank_story(v: RunView) -> list[dict[str, Any]]:
    """Per rank, what it did at the end, as data: `status` (a code the rank-summary rule
    says in words: failed_first, failed, timed_out, lost_peer, waited_*, finished,
    killed, killed_during, no_record), `killed` ("yes" when the launcher killed it after),
    `when` (step, before_first) and `step`, `waited_in`, `during`, `exception`, `module`."""
    ranks = [p for p in v.watched if p.rank is not None]
    failures = sorted((p.first_exception.get("time", 0), p.rank) for p in ranks if p.first_exception)
    first_rank = failures[0][1] if failures else None
    out = []
    for p in sorted(ranks, key=lambda x: x.rank):  # type: ignore[arg-type, return-value]
        exc = p.first_exception
        prog = p.data.get("progress") or {}
        step = prog.get("step", p.watch.get("step"))
        where = prog.get("where")
        entry: dict[str, Any] = {"rank": p.rank, "pid": p.data.get("pid"), "step": step,
                                 "when": None if step is None else ("step" if step >= 0 else "before_first")}
        if exc is not None:
            text = exc.get("exception", "").split("\n")[0]
            if any(w in text for w in ("timed out", "Timeout", "timeout")):
                status = "timed_out"
            elif any(w in text for w in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                         "NCCL communicator was aborted")):
                status = "lost_peer"
            else:
                status = "failed_first" if p.rank == first_rank else "failed"
            if status in ("timed_out", "lost_peer") and where:
                status = "waited_" + status
                entry["waited_in"] = where.removeprefix("in ")
            entry["status"] = status
            if p.data.get("exit") is None:
                entry["killed"] = "yes"
            entry["exception"] = text[:120]
            if exc.get("module"):
                entry["module"] = exc["module"]
        elif p.data.get("exit") is not None:
            entry["status"] = "finished"
        elif where and where.startswith("in "):
            entry["status"] = "waited_killed"
            entry["waited_in"] = where[3:]
        elif where:
            entry["status"], entry["during"] = "killed_during", where
        else:
            entry["status"] = "killed"
        out.append(entry)
    # a rank of the group that left nothing (killed before its first step) is part of the story
    seen = {e["rank"] for e in out}
    for r in range(v.world_size):
        if r not in seen and len(out) < 64:
            out.append({"rank": r, "pid": None, "step": None, "status": "no_record"})
    return sorted(out, key=lambda e: e["rank"])


# what one rank's record may carry (the rank-summary rule's [each] templates say them)
RANK_RECORD_FACTS = ("rank", "status", "killed", "when", "step", "waited_in", "during", "exception", "module")


@check(facts=("story", "first_failed_rank", "ranks", "_first", "_others", "_details") + RANK_RECORD_FACTS)
def rank_summary(v: RunView) -> Result:
    if not v.multi_rank:
        return []
    story = rank_story(v)
    first = next((r for r in story if r["status"] == "failed_first"), None)
    others = [r for r in story if r is not first]
    return [Hit({"story": story, "first_failed_rank": first["rank"] if first else None, "ranks": len(story),
                 "_first": [first] if first else None, "_others": others or None, "_details": story},
                [("ranks", " ".join(f"{k}={r[k]}" for k in RANK_RECORD_FACTS if r.get(k) is not None))
                 for r in story])]


@check(facts=("errors", "first_error"))
def instrumentation_stopped(v: RunView) -> Result:
    errors = [e for p in v.processes for e in (p.data.get("internal_errors") or []) + (p.watch.get("internal_errors") or [])]
    errors = list(dict.fromkeys(errors))
    if not errors:
        return []
    return [Hit({"errors": len(errors), "first_error": errors[0]}, [("internal_errors", e) for e in errors[:3]])]


# Accelerator out-of-memory messages (torch.OutOfMemoryError; CUDA, HIP, XPU, MPS wording)
_OOM_WORDS = (" out of memory", "OutOfMemoryError", "MPS backend out of memory")


@check(facts=("tries", "first_error", "module", "first_step", "resumed_step", "batch_shapes"))
def oom_recovered(v: RunView) -> Result:
    """Out-of-memory errors the program caught, after which an optimizer step completed
    (the instrumentation moves such an exception from `errors` to `recovered`): a retry
    with a smaller batch (accelerate's find_executable_batch_size) that then trained."""
    for p in v.watched:
        caught = [e for e in p.watch.get("recovered") or []
                  if any(w in str(e.get("exception") or "") for w in _OOM_WORDS)]
        if not caught:
            continue
        first = caught[0]
        shapes = list(dict.fromkeys(str(tuple(s)) for e in caught
                                    if (s := (e.get("context") or {}).get("batch_shape"))))
        return [Hit({"tries": len(caught), "first_error": str(first.get("exception") or "").split("\n")[0][:200],
                     "module": first.get("module") or None, "first_step": first.get("step"),
                     "resumed_step": caught[-1].get("recovered_at_step"),
                     "batch_shapes": ", ".join(shapes[:8]) or None},
                    [(f"{p.path}.watch.recovered[{i}]", f"step {e.get('step')}: "
                      f"{str(e.get('exception') or '').splitlines()[0][:160] if e.get('exception') else '?'}; "
                      f"trained on at step {e.get('recovered_at_step')}") for i, e in enumerate(caught[:3])])]
    return []
