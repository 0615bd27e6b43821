"""JobView: what the job checks see of a job's evidence (job/read.py's JSON document).

    {"schema": "mpdoctor-job/1",
     "ranks": [{"rank": 0, "node": "node0", "local_rank": 0, "sources": [...],
                "errors": [{"rule": "gloo-collective-mismatch", "consequence": true?, "time": 1.7e9?,
                            "timed_out": true?, "text": "...", "line": 2, "source": "..."}
                           | {"rule": null, "exception": "ValueError: ...", ...}],
                "exit": {"code": -6, "signal": "SIGABRT", "time": ..., "root_cause": true?},
                "stack": {"where": "train.py:31 in main", "collective": "all_reduce"?}?}],
     "nodes": [{"node": "host-a", "ranks": [0, 1], "env": {"torch": "2.13.0", ...}, "exit_code": 1}],
     "collectives": [{"rank": 0, "pg": "0", "seq": 1, "op": "all_reduce", "input_dtypes": [...],
                      "input_sizes": [[4, 16]], "state": "completed", "site": "train.py:35"}],
     "launcher": [...findings on lines of no rank...]}
"""

from __future__ import annotations

from typing import Any


class JobView:
    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.ranks: list[dict[str, Any]] = sorted(data.get("ranks") or [], key=lambda r: r["rank"])
        self.nodes: list[dict[str, Any]] = data.get("nodes") or []
        self.collectives: list[dict[str, Any]] = data.get("collectives") or []

    # ---- who failed first ----------------------------------------------------------------
    @staticmethod
    def causes(rank: dict[str, Any]) -> list[dict[str, Any]]:
        """A rank's errors that are not fallout of another's (a timeout, a lost peer)."""
        return [e for e in rank.get("errors") or [] if not e.get("consequence") and not e.get("timed_out")
                and e.get("severity", "error") == "error"]

    @staticmethod
    def _when(rank: dict[str, Any], errors: list[dict[str, Any]]) -> float | None:
        times = [e["time"] for e in errors if e.get("time") is not None]
        if times:
            return min(times)
        return (rank.get("exit") or {}).get("time")

    def first_failure(self) -> tuple[dict[str, Any], str] | None:
        """(the rank that failed first, how that was decided: a code the rule says)."""
        failing = [(r, self.causes(r)) for r in self.ranks]
        causing = [(r, c) for r, c in failing if c]
        if not causing:
            # no rank has an error of its own: a rank that died by a signal that is not the
            # launcher's (SIGABRT, SIGSEGV, SIGKILL by the OOM killer), else the rank the
            # others waited for (it did not time out where they did)
            crashed = [r for r in self.ranks if (r.get("exit") or {}).get("signal") not in (None, "SIGTERM", "SIGINT")]
            if len(crashed) == 1:
                return crashed[0], "crashed"
            timed = [r for r in self.ranks if any(e.get("timed_out") for e in r.get("errors") or [])]
            others = [r for r in self.ranks if r not in timed]
            if timed and len(others) == 1:
                return others[0], "straggler"
            roots = [r for r in self.ranks if (r.get("exit") or {}).get("root_cause")]
            if len(roots) == 1:
                return roots[0], "launcher"
            return None
        if len(causing) == 1:
            return causing[0][0], "only_cause"
        timed = [(self._when(r, c), r["rank"], r) for r, c in causing]
        if all(t is not None for t, _, _ in timed):
            return min(timed, key=lambda x: (x[0], x[1]))[2], "timestamps"
        # as many causes, without times: the lowest rank whose cause is the job's most specific
        return causing[0][0], "lowest_rank"

    @staticmethod
    def cause_of(rank: dict[str, Any]) -> str | None:
        c = JobView.causes(rank)
        pick = c[0] if c else next(iter(rank.get("errors") or []), None)
        if pick is None:
            return None
        return pick.get("title") or pick.get("exception") or pick.get("rule")

    # ---- collectives -----------------------------------------------------------------------
    def collectives_by_call(self) -> list[tuple[tuple[str, int], dict[int, dict[str, Any]]]]:
        """[((process group, sequence number), {rank: entry})] in sequence order."""
        calls: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        for e in self.collectives:
            if e.get("seq") is None or e.get("rank") is None:
                continue
            calls.setdefault((str(e.get("pg")), int(e["seq"])), {})[int(e["rank"])] = e
        return sorted(calls.items(), key=lambda kv: (kv[0][0], kv[0][1]))

    def collective_ranks(self) -> list[int]:
        return sorted({int(e["rank"]) for e in self.collectives if e.get("rank") is not None})

    def last_collective(self, rank: int) -> str | None:
        mine = [e for e in self.collectives if e.get("rank") == rank and e.get("seq") is not None]
        if not mine:
            return None
        e = max(mine, key=lambda x: int(x["seq"]))
        return f"{e.get('op')} #{e['seq']}" + (f" ({e['site']})" if e.get("site") else "")
