"""The checks of the job rules (rules/job/*.toml): small pure functions of a JobView.

They say when, and with which facts; the rule files hold the words. A rank's errors are
the log findings of its sources (rule, consequence or cause, time); its exit is what its
launcher reported; the collectives are the Flight Recorder's entries of every rank.
"""

from __future__ import annotations

import re
from typing import Any

from ..engine.judge import Hit, Result, Skip, check
from .view import JobView

# what a rank that did not fail first saw, as a code the job-first-failure rule says in words
FALLOUT_FACTS = ("what", "count", "ranks", "sample")
_PREFIXES = re.compile(r"^(?:\[[\w-]{1,24}\]:\s?){1,3}")


def _ranks_text(ranks: list[int]) -> str:
    """0, 2-5, 9: ranks as a short list."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}" if j > i + 1 else f"{rs[i]}, {rs[j]}")
        i = j + 1
    return ", ".join(out)


def _fallout_code(rank: dict[str, Any]) -> str:
    """What a rank that did not fail first saw: timed_out, lost_peer, terminated, failed, quiet."""
    errors = rank.get("errors") or []
    if any(e.get("timed_out") for e in errors):
        return "timed_out"
    if any(e.get("consequence") for e in errors):
        return "lost_peer"
    sig = (rank.get("exit") or {}).get("signal")
    if sig in ("SIGTERM", "SIGKILL", "SIGINT"):
        return "terminated"
    if errors:
        return "failed"
    return "quiet"


_LEAD = {"straggler": "late", "crashed": "crashed"}


def _clean(text: str) -> str:
    return _PREFIXES.sub("", text).strip()


@check(facts=("first_rank", "first_node", "cause", "how", "world", "fallout", "signal", "_on_node", "_first_source",
              "_fallout", "_lead", "_late") + FALLOUT_FACTS)
def first_failure(v: JobView) -> Result:
    if len(v.ranks) < 2:
        return Skip("fewer than two ranks in the job")
    first = v.first_failure()
    if first is None:
        return []
    rank, how = first
    others: dict[str, list[int]] = {}
    samples: dict[str, str] = {}
    for r in v.ranks:
        if r["rank"] == rank["rank"]:
            continue
        code = _fallout_code(r)
        others.setdefault(code, []).append(r["rank"])
        errors = r.get("errors") or []
        fitting = [e for e in errors if e.get("timed_out")] if code == "timed_out" else errors
        text = next((e.get("text") or e.get("exception") for e in fitting + errors
                     if e.get("text") or e.get("exception")), None)
        if text and code not in samples:
            samples[code] = _clean(text)[:120]
    fallout = [{"what": code, "count": len(rs), "ranks": _ranks_text(rs), "sample": samples.get(code)}
               for code, rs in sorted(others.items(), key=lambda kv: (-len(kv[1]), kv[0])) if code != "quiet"]
    cause = None if how == "straggler" else v.cause_of(rank)
    facts = {"first_rank": rank["rank"], "first_node": rank.get("node") or rank.get("host"), "how": how,
             "cause": cause, "world": len(v.ranks), "fallout": fallout or None, "_fallout": fallout or None,
             "_on_node": rank.get("node") or rank.get("host"),
             "_first_source": (rank.get("sources") or [None])[0], "_lead": _LEAD.get(how, "failed"),
             "signal": (rank.get("exit") or {}).get("signal"), "_late": "yes" if how == "straggler" else None}
    ev = [(f"ranks[{rank['rank']}]", f"{cause or 'failed'} ({how})")]
    ev += [(f"ranks[{f['ranks']}]", f"{f['what']} x{f['count']}") for f in fallout]
    return [Hit(facts, ev)]


def _precisions(v: JobView) -> str | None:
    """Each node's mixed-precision setting as its run saw it, with its ranks (where reports say)."""
    said = [f"ranks {_ranks_text(n.get('ranks') or [])} ({n['node']}): {n['env']['mixed_precision']}"
            for n in v.nodes if (n.get("env") or {}).get("mixed_precision") and n.get("ranks")]
    return "; ".join(said) if len(said) > 1 else None


@check(facts=("seq", "op", "pg", "ranks_a", "ranks_b", "dtypes_a", "dtypes_b", "sizes_a", "sizes_b", "op_a", "op_b",
              "sites", "differs", "precisions"))
def collective_mismatch(v: JobView) -> Result:
    if not v.collectives:
        return Skip("no Flight Recorder record in the job")
    hits = []
    for key, by_rank in v.collectives_by_call():
        sigs: dict[tuple, list[int]] = {}
        for rank, e in sorted(by_rank.items()):
            sig = (e.get("op"), tuple(e.get("input_dtypes") or ()), tuple(map(tuple, e.get("input_sizes") or ())))
            sigs.setdefault(sig, []).append(rank)
        if len(sigs) < 2:
            continue
        (sa, ra), (sb, rb) = sorted(sigs.items(), key=lambda kv: -len(kv[1]))[:2]
        differs = "dtypes" if sa[1] != sb[1] else "sizes" if sa[2] != sb[2] else "ops"
        sites = "; ".join(f"rank {r}: {by_rank[r].get('site')}" for r in sorted(by_rank) if by_rank[r].get("site"))
        pg, seq = key
        hits.append(Hit({"seq": seq, "pg": pg, "op": sa[0], "ranks_a": _ranks_text(ra), "ranks_b": _ranks_text(rb),
                         "dtypes_a": ", ".join(sa[1]) or None, "dtypes_b": ", ".join(sb[1]) or None,
                         "sizes_a": " ".join(str(list(s)) for s in sa[2]) or None,
                         "sizes_b": " ".join(str(list(s)) for s in sb[2]) or None,
                         "op_a": sa[0], "op_b": sb[0], "sites": sites or None, "differs": differs,
                         "precisions": _precisions(v) if differs == "dtypes" else None},
                        [(f"collectives[pg {pg}, seq {seq}].rank{r}", f"{by_rank[r].get('op')} "
                          f"{by_rank[r].get('input_dtypes')} {by_rank[r].get('input_sizes')}")
                         for r in sorted(by_rank)]))
        break  # the first mismatched collective: what follows it is its fallout
    return hits


@check(facts=("seq", "op", "pg", "missing", "present", "missing_at", "state"))
def collective_incomplete(v: JobView) -> Result:
    """A collective some ranks entered and others never reached, or that never completed."""
    if not v.collectives:
        return Skip("no Flight Recorder record in the job")
    expected = set(v.collective_ranks())
    if len(expected) < 2:
        return Skip("the Flight Recorder record holds fewer than two ranks")
    for key, by_rank in v.collectives_by_call():
        states = {e.get("state") for e in by_rank.values()}
        missing = sorted(expected - set(by_rank))
        # gloo leaves every entry "scheduled" (it is retired when done): only "started" says a
        # collective began and never finished
        if not missing and "started" not in states:
            continue
        pg, seq = key
        any_e = next(iter(by_rank.values()))
        where = "; ".join(f"rank {r} at {v.last_collective(r)}" for r in missing if v.last_collective(r))
        return [Hit({"seq": seq, "pg": pg, "op": any_e.get("op"), "missing": _ranks_text(missing) or None,
                     "present": _ranks_text(list(by_rank)), "missing_at": where or None,
                     "state": ", ".join(sorted(s for s in states if s and s != "completed")) or None},
                    [(f"collectives[pg {pg}, seq {seq}].rank{r}", e.get("state")) for r, e in sorted(by_rank.items())])]
    return []


_NODE_KEYS = ("torch", "cuda", "driver", "accelerate", "gpu", "mixed_precision", "python")


@check(facts=("what", "values", "nodes"))
def nodes_differ(v: JobView) -> Result:
    if len(v.nodes) < 2:
        return Skip("fewer than two nodes' reports in the job")
    hits = []
    for key in _NODE_KEYS:
        seen: dict[str, list[str]] = {}
        for n in v.nodes:
            val = (n.get("env") or {}).get(key)
            if val not in (None, ""):
                seen.setdefault(str(val), []).append(n["node"])
        if len(seen) > 1:
            values = "; ".join(f"{val} on {', '.join(ns)}" for val, ns in sorted(seen.items()))
            hits.append(Hit({"what": key, "values": values, "nodes": len(v.nodes)},
                            [(f"nodes[{', '.join(ns)}].env.{key}", val) for val, ns in sorted(seen.items())]))
    return hits


@check(facts=("stuck_rank", "stuck_where", "waiting", "waiting_in"))
def hang_stacks(v: JobView) -> Result:
    stacks = {r["rank"]: r["stack"] for r in v.ranks if r.get("stack")}
    if len(stacks) < 2:
        return Skip("fewer than two ranks' stacks in the job")
    waiting = {r: s for r, s in stacks.items() if s.get("collective")}
    elsewhere = {r: s for r, s in stacks.items() if not s.get("collective")}
    if not waiting or not elsewhere:
        return []
    hits = []
    in_ = sorted({s["collective"] for s in waiting.values()})
    for r, s in sorted(elsewhere.items()):
        hits.append(Hit({"stuck_rank": r, "stuck_where": s.get("where"), "waiting": _ranks_text(list(waiting)),
                         "waiting_in": ", ".join(in_)},
                        [(f"ranks[{r}].stack", s.get("where"))] +
                        [(f"ranks[{w}].stack", f"{ws.get('collective')} at {ws.get('where')}")
                         for w, ws in sorted(waiting.items())]))
    return hits
