"""Reading a job's sources into one record: what each rank and each node said.

Every log goes through the one log pipeline (logs.regions, logtext.normalise, the log
rules); a log of more than SMALL bytes is scanned for what a rule could match and only
those regions are normalised, so a folder of a thousand rank logs is read at the speed
of a literal search. What comes out is data (the job's evidence, JSON): per rank its
findings (rule, consequence or cause, when), its exit as the launcher reported it, its
stack in a hang; per node its run report; the Flight Recorder's collectives.
"""

from __future__ import annotations

import copy
import json
import os
import re

from ..findings import Evidence, Finding, Unrecognised
from ..logs.explain import explain_lines, prefilter_for
from ..logtext import normalise
from .sources import Source, SourceError, attribute, expand

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..engine.rule import Rule

SCHEMA = "mpdoctor-job/1"
SMALL = 64 * 1024  # read whole up to this; more is region-scanned
MAX_FINDINGS_PER_RANK = 16

# Timestamps a line may start with: glog (torch's C++ and elastic logs: E1203 16:07:21.848000),
# ISO / logging (2026-12-03 16:07:21,848 or T...Z), torchrun's summary (2026-12-03_16:07:21)
_TIME = re.compile(r"(?:(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ T_]|[IWEF](?P<gmo>\d\d)(?P<gd>\d\d) )"
                   r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?")
# torchrun's error summary (ChildFailedError), one block per failed rank
_SUMMARY_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s*(?P<value>.*)$")
_SUMMARY_RANK = re.compile(r"(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_SUMMARY_EXIT = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?(?:\s+\((?P<signal>SIG\w+)\))?")
# torchrun --tee: `[default<local rank>]:[rank<global rank>]:`; the normaliser reads the first
_TEE = re.compile(r"^\[default(?P<local>\d+)\]:(?:\[rank(?P<rank>\d+)\]:)?")
_DIGITS = re.compile(r"\d+")
# a timeout, as the ranks that waited say it
TIMED_OUT = re.compile(r"[Tt]imed out|[Tt]imeout|timeout")


def time_of(text: str) -> float | None:
    """Seconds (comparable within one job) from a line's leading timestamp, or None."""
    m = _TIME.search(text[:64])
    if not m:
        return None
    if m.group("y"):
        import calendar

        base = calendar.timegm((int(m.group("y")), int(m.group("mo")), int(m.group("d")), 0, 0, 0))
    else:  # glog has no year: this year's, for ordering within one job
        import calendar
        import time as _t

        base = calendar.timegm((_t.gmtime().tm_year, int(m.group("gmo")), int(m.group("gd")), 0, 0, 0))
    frac = float("0." + m.group("f")) if m.group("f") else 0.0
    return base + int(m.group("h")) * 3600 + int(m.group("mi")) * 60 + int(m.group("s")) + frac


LEAD_LINES = 12  # lines kept above a region's first hit (the scan keeps 80: a whole traceback's worth)


def _lead_trimmed(finder: Any, first_no: int, region: bytes) -> tuple[int, bytes]:
    """A rank's region without most of the training lines above its first hit: a rank log's
    error starts at its Traceback header or its error line, both hits of their own."""
    try:
        hits = finder.positions(region)
    except Exception:
        return first_no, region
    if not hits:
        return first_no, region
    start = hits[0]
    for _ in range(LEAD_LINES + 1):
        i = region.rfind(b"\n", 0, start)
        if i < 0:
            return first_no, region
        start = i
    start += 1
    return first_no + region.count(b"\n", 0, start), region[start:]


def _global_ranks(lines: list[Any]) -> list[Any]:
    """An agent's tee'd output numbers its workers by local rank (`[default0]:`): on a node
    other than the first, local rank 0 is not global rank 0. The global rank of a line is
    read from its `[rankN]:`, or the agent's base (global minus local, seen on any line)."""
    base = None
    tees = []
    for ln in lines:
        if ln.raw.startswith("[default"):
            m = _TEE.match(ln.raw)
            if m:
                tees.append((ln, m))
                if m.group("rank") is not None and base is None:
                    base = int(m.group("rank")) - int(m.group("local"))
    for ln, m in tees:
        ln.rank = int(m.group("rank")) if m.group("rank") is not None else (
            base + int(m.group("local")) if base is not None else None)
    return lines


class JobReader:
    """Reads sources into the job's evidence (a dict, JSON), keeping the log findings
    themselves (Finding objects) for the report."""

    def __init__(self, rules: list[Rule], progress: Callable[[int, int | None], None] | None = None):
        self.rules = rules
        self.progress = progress
        self.findings: list[Finding] = []  # every log finding, with its ranks
        self.unrecognised: list[Unrecognised] = []
        self.ranks: dict[int, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.collectives: list[dict[str, Any]] = []
        self.launcher: list[dict[str, Any]] = []  # findings on lines of no rank (the launchers' own)
        self.sources: list[Source] = []
        self.bytes = 0
        self._memo: dict[int, tuple] = {}
        self._fresh: dict[str, Any] | None = None
        self._base: dict[str, int] = {}  # group -> global rank of its local rank 0
        self._pending: list[tuple[Source, list[tuple[Finding, float | None]], list[Unrecognised]]] = []
        self._reported: list[tuple[Source, list[tuple[Finding, float | None]], list[Unrecognised]]] = []

    # ---- the whole job -----------------------------------------------------------------
    def read(self, paths: list[str]) -> dict[str, Any]:
        files = expand(paths)
        if not files:
            raise SourceError("no file to read in " + ", ".join(paths))
        self.sources = attribute(files, [p for p in paths if os.path.isdir(p)])
        total = sum(s.size for s in self.sources) or None
        done = 0
        for s in self.sources:
            if s.kind == "job":
                self._read_recorded(s)
            elif s.kind == "flight":
                from .flight import read_dump

                self.collectives += read_dump(s)
            elif s.kind == "json" and self._read_report(s):
                pass
            elif s.kind == "stack":
                from .stacks import read_stack

                st = read_stack(s)
                if st is not None and s.rank is not None:
                    self._rank(s.rank, s)["stack"] = st
            else:
                self._read_log(s)
            done += s.size
            if self.progress is not None:
                self.progress(done, total)
        self.bytes = done
        self._settle()
        for n in self.nodes.values():  # a node's ranks carry its (disambiguated) name
            for r in n.get("ranks") or []:
                rec = self.ranks.get(r)
                if rec is not None and (not rec.get("node") or n["node"].startswith(rec["node"] + "[")):
                    rec["node"] = n["node"]
        return self.evidence()

    def evidence(self) -> dict[str, Any]:
        return {"schema": SCHEMA,
                "ranks": [self.ranks[r] for r in sorted(self.ranks)],
                "nodes": [self.nodes[n] for n in sorted(self.nodes)],
                "collectives": self.collectives,
                "launcher": self.launcher,
                "sources": len(self.sources)}

    # ---- one rank's log ----------------------------------------------------------------
    def _read_log(self, s: Source) -> None:
        lines = self._lines(s)
        if not lines:  # an empty log is a rank that said nothing (a straggler, often)
            self._pending.append((s, [], []))
            return
        timed, unrecognised = self._explain(lines)
        # the global rank of a torchrun agent's local rank 0, from a [rankN] prefix
        if s.group is not None and s.local_rank is not None and s.group not in self._base:
            seen = next((ln.rank for ln in lines if ln.rank is not None), None)
            if seen is not None:
                self._base[s.group] = seen - s.local_rank
        self._summaries(lines, s)
        self._pending.append((s, timed, unrecognised))

    def _explain(self, lines: list[Any]) -> tuple[list[tuple[Finding, float | None]], list[Unrecognised]]:
        """The log rules over one rank's lines. A thousand ranks mostly say the same thing
        (the same lost peer, another port): lines that differ only in their numbers are
        matched once, and each rank gets that finding on its own ranks and times."""
        key = hash(tuple(_DIGITS.sub("#", ln.text) for ln in lines))
        ranks = sorted({ln.rank for ln in lines if ln.rank is not None})
        memo = self._memo.get(key)
        if memo is None:
            report = explain_lines(lines, self.rules)
            index = {ln.no: i for i, ln in enumerate(lines)}
            at = []
            for f in report.findings:
                no = next((e.line for e in f.evidence if e.line is not None), None)
                at.append(index.get(no) if no is not None else None)
            memo = self._memo[key] = (report.findings, at, report.unrecognised, ranks)
            if len(self._memo) > 4096:
                self._memo.pop(next(iter(self._memo)))
            found, unknown = report.findings, report.unrecognised
        else:
            template, at, unknown0, ranks0 = memo
            same = ranks == ranks0
            found = [f.replace(ranks=list(f.ranks) if same or not f.ranks else ranks, evidence=list(f.evidence),
                               facts=dict(f.facts)) for f in template]
            unknown = [Unrecognised(u.exception, u.line, u.user_frame, u.count,
                                    list(u.ranks) if same or not u.ranks else ranks) for u in unknown0]
        at = memo[1]
        timed = [(f, time_of(lines[i].raw) if i is not None and i < len(lines) else None) for f, i in zip(found, at)]
        return timed, unknown

    def _lines(self, s: Source) -> list[Any]:
        return _global_ranks(self._read_lines(s))

    def _read_lines(self, s: Source) -> list[Any]:
        try:
            if s.size <= SMALL:
                with open(s.path, "rb") as fh:
                    data = fh.read()
                if b"\0" in data[:4096]:
                    return []
                return normalise(data.decode("utf-8", "replace"))
            from ..logs.regions import CHUNK

            scanner = self._scanner()
            with open(s.path, "rb") as fh:
                while True:
                    chunk = fh.read(CHUNK)
                    if not chunk:
                        break
                    scanner.feed(chunk)
            lines = []
            for first_no, region in scanner.finish():
                first_no, region = _lead_trimmed(scanner.finder, first_no, region)
                lines.extend(normalise(region.decode("utf-8", "replace"), first_no))
            return lines
        except OSError as exc:
            raise SourceError(f"{s.path}: cannot be read ({exc.strerror or exc})") from None

    def _scanner(self) -> Any:
        """A fresh region scanner sharing the first one's literal finder: a thousand rank logs
        load the compiled scan once, not once a file."""
        from ..logs.regions import RegionScanner

        if self._fresh is None:
            first = RegionScanner(prefilter_for(self.rules))
            self._fresh = {k: v if k in ("finder", "engine") else copy.copy(v) for k, v in vars(first).items()}
            return first
        scanner = RegionScanner.__new__(RegionScanner)
        for k, v in self._fresh.items():
            setattr(scanner, k, v if k in ("finder", "engine") else copy.copy(v))
        return scanner

    def _summaries(self, lines: list[Any], s: Source) -> None:
        """torchrun's ChildFailedError summary: each failed rank's exit, time and host."""
        block: dict[str, str] = {}
        root = False

        def flush() -> None:
            m = _SUMMARY_RANK.search(block.get("rank", ""))
            if m:
                e = _SUMMARY_EXIT.match(block.get("exitcode", ""))
                exit_ = {"code": int(e.group("code")) if e else None, "signal": e.group("signal") if e else None,
                         "time": time_of(block.get("time", "")), "root_cause": root or None}
                rec = self._rank(int(m.group("rank")), None)
                rec["local_rank"] = int(m.group("local"))
                if block.get("host"):
                    rec.setdefault("host", block["host"].strip())
                rec["exit"] = {k: v for k, v in exit_.items() if v is not None}
            block.clear()

        for ln in lines:
            t = ln.text
            if "Root Cause" in t:
                flush()
                root = True
                continue
            if t.startswith("Failures:"):
                flush()
                root = False
                continue
            m = _SUMMARY_FIELD.match(t)
            if m:
                if m.group("key") == "time" and block:
                    flush()
                block[m.group("key")] = m.group("value").strip()
        if block:
            flush()

    # ---- reports and recorded evidence --------------------------------------------------
    def _read_report(self, s: Source) -> bool:
        """An `mpdoctor run` report (JSON): its node, ranks, environment, plan, findings."""
        try:
            with open(s.path, "rb") as fh:
                data = json.loads(fh.read(64 * 1024 * 1024))
        except (OSError, ValueError):
            return False
        if not isinstance(data, dict) or "findings" not in data or "exit_code" not in data:
            return False
        from .nodes import node_of_report

        node = node_of_report(data, s)
        if node["node"] in self.nodes:  # two nodes of one host name (agents on one machine): by their ranks
            other = self.nodes.pop(node["node"])
            for n in (other, node):
                n["node"] = f"{n['node']}[ranks {','.join(map(str, n['ranks'])) or '?'}]"
                self.nodes[n["node"]] = n
        else:
            self.nodes[node["node"]] = node
        for r in data.get("ranks") or []:
            if isinstance(r, dict) and isinstance(r.get("rank"), int) and r.get("pid") is not None:
                rec = self._rank(r["rank"], None)
                rec.setdefault("node", node["node"])
        # the report's own findings (the node's output and what its ranks recorded): used for
        # the ranks no log of the job covers (a job folder of reports only)
        own = list(node.get("ranks") or [])
        per_node = node.get("local_world_size")

        def global_ranks(ranks: list[int]) -> list[int]:
            # the node's output numbers its workers by local rank (`[default1]:`): on a node
            # whose ranks are 2 and 3, rank "1" is its local rank 1, global rank 3
            if per_node and own and len(own) == per_node and any(r not in own for r in ranks):
                return sorted({own[r] if 0 <= r < per_node and r not in own else r for r in ranks})
            return ranks

        found = []
        for d in data.get("findings") or []:
            f = _finding_of(d, self.rules)
            if f is not None and f.ranks:
                f.ranks = global_ranks(f.ranks)
                found.append((f, None))
        unknown = [Unrecognised(str(u.get("exception", "")), int(u.get("line") or 0), u.get("user_frame"),
                                int(u.get("count") or 1),
                                global_ranks([r for r in u.get("ranks") or [] if isinstance(r, int)]))
                   for u in data.get("unrecognised") or [] if isinstance(u, dict) and u.get("ranks")]
        self._reported.append((Source(s.path, "report", node=node["node"]), found, unknown))
        return True

    def _read_recorded(self, s: Source) -> None:
        try:
            with open(s.path, "rb") as fh:
                data = json.loads(fh.read(64 * 1024 * 1024))
        except (OSError, ValueError) as exc:
            raise SourceError(f"{s.path}: not a job's evidence ({exc})") from None
        for r in data.get("ranks") or []:
            self.ranks[r["rank"]] = r
        for n in data.get("nodes") or []:
            self.nodes[n["node"]] = n
        self.collectives += data.get("collectives") or []
        self.launcher += data.get("launcher") or []

    # ---- ranks -------------------------------------------------------------------------
    def _rank(self, rank: int, s: Source | None) -> dict[str, Any]:
        rec = self.ranks.get(rank)
        if rec is None:
            rec = self.ranks[rank] = {"rank": rank, "errors": []}
        if s is not None:
            if s.node and not rec.get("node"):
                rec["node"] = s.node
            if s.local_rank is not None:
                rec.setdefault("local_rank", s.local_rank)
        return rec

    def _settle(self) -> None:
        """Each log finding to the ranks it belongs to, now that every agent's rank base is known;
        a node report's findings for the ranks no log covered."""
        self._settle_logs(self._pending)
        covered = {r for r, rec in self.ranks.items() if rec.get("errors")}
        for s, found, unknown in self._reported:
            found = [(f, t) for f, t in found if not set(f.ranks) <= covered]
            unknown = [u for u in unknown if not set(u.ranks) <= covered]
            if found or unknown:
                self._settle_logs([(s, found, unknown)])
        self._reported.clear()
        for rec in self.ranks.values():
            rec["errors"] = [{k: v for k, v in e.items() if v is not None} for e in rec["errors"]]

    def _settle_logs(self, pending: list[Any]) -> None:
        for s, timed, unrecognised in pending:
            own = s.rank
            if own is None and s.local_rank is not None and s.group in self._base:
                own = self._base[s.group] + s.local_rank
            for f, t in timed:
                ranks = list(f.ranks) or ([own] if own is not None else [])
                if own is not None and not f.ranks:
                    f.ranks = [own]
                # which of the job's files a log line is from (its JSON says; its line number stays)
                f.evidence = [Evidence(e.text, e.line, s.path) if e.source == "log" and s.kind != "report" else e
                              for e in f.evidence]
                self.findings.append(f)
                entry = {"rule": f.rule, "title": f.title[:200], "category": f.category, "severity": f.severity,
                         "consequence": f.consequence or None, "time": t,
                         "text": f.evidence[0].text[:200] if f.evidence else None,
                         "line": f.evidence[0].line if f.evidence else None,
                         "timed_out": bool(f.evidence and TIMED_OUT.search(f.evidence[0].text)) or None,
                         "source": s.path}
                entry = {k: v for k, v in entry.items() if v is not None}
                if not ranks:
                    self.launcher.append(entry)
                for r in ranks:
                    rec = self._rank(r, s if r == own or own is None else None)
                    if len(rec["errors"]) < MAX_FINDINGS_PER_RANK:
                        rec["errors"].append(entry)
            for u in unrecognised:
                ranks = list(u.ranks) or ([own] if own is not None else [])
                if own is not None and not u.ranks:
                    u.ranks = [own]
                self.unrecognised.append(u)
                for r in ranks:
                    rec = self._rank(r, s if r == own or own is None else None)
                    if len(rec["errors"]) < MAX_FINDINGS_PER_RANK:
                        rec["errors"].append({"rule": None, "exception": u.exception[:200], "line": u.line,
                                              "timed_out": bool(TIMED_OUT.search(u.exception)) or None,
                                              "source": s.path})
            if own is not None:
                rec = self._rank(own, s)
                rec.setdefault("sources", [])
                if len(rec["sources"]) < 8:
                    rec["sources"].append(s.path)
        pending.clear()


def _finding_of(d: Any, rules: list[Rule]) -> Finding | None:
    """A finding of a node's report, said again by this machine's rule of the same id over
    the facts the report carries (only rules speak: a report's words are not copied); a
    finding whose rule this rule base does not have is left out."""
    from ..engine.assemble import assemble

    if not isinstance(d, dict):
        return None
    rule = next((r for r in rules if r.id == d.get("rule")), None)
    if rule is None:
        return None
    ev = [Evidence(str(e.get("text", "")), e.get("line"), str(e.get("source") or "log"))
          for e in d.get("evidence") or [] if isinstance(e, dict)]
    facts = dict(d.get("facts") or {}) if isinstance(d.get("facts"), dict) else {}
    if d.get("severity") in ("error", "warning", "info"):
        facts.setdefault("severity", d["severity"])  # as the node judged it (a survived or likely one)
    return assemble(rule, facts, ev, count=int(d.get("count") or 1),
                    ranks=[r for r in d.get("ranks") or [] if isinstance(r, int)], likely=bool(d.get("likely")))


def read_job(paths: list[str], rules: list[Rule], progress: Any = None) -> JobReader:
    reader = JobReader(rules, progress)
    reader.read(paths)
    return reader
