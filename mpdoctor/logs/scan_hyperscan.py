"""The Hyperscan literal scan of a big log: the prefilter's expressions at memory speed,
the compiled database cached beside the rule cache."""

from __future__ import annotations

import os
import re

from .prefilter import TRIGGERS, Prefilter


class HyperscanFinder:
    engine = "hyperscan"

    def __init__(self, spec: Prefilter):
        import hyperscan  # optional, fast

        self.hs = hyperscan
        exprs: list[tuple[bytes, int]] = [(re.escape(t.encode()), hyperscan.HS_FLAG_CASELESS) for t in TRIGGERS]
        for expr, caseless in spec.skeletons:
            exprs.append((expr, hyperscan.HS_FLAG_CASELESS if caseless else 0))
        if not spec.skeletons:
            exprs += [(re.escape(lit.encode()), hyperscan.HS_FLAG_CASELESS) for lit in spec.literals]
        for expr, caseless in spec.first_skeletons:  # reported once per chunk
            exprs.append((expr, (hyperscan.HS_FLAG_CASELESS if caseless else 0) | hyperscan.HS_FLAG_SINGLEMATCH))
        exprs = sorted(set(exprs))
        self.db = cached_database(hyperscan, exprs)

    def positions(self, buf: bytes) -> list[int]:
        out: list[int] = []

        def on_match(_id: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            out.append(to - 1)

        self.db.scan(buf, match_event_handler=on_match)
        out.sort()
        return out


def cached_database(hyperscan, exprs: list[tuple[bytes, int]]):
    """Compile (a second or so for a few hundred skeletons) or load the database compiled
    for the same expressions before, from the rule cache folder."""
    import hashlib

    from ..engine.rulecache import cache_dir

    key = hashlib.sha256(repr((hyperscan.__version__ if hasattr(hyperscan, "__version__") else "",
                               exprs)).encode()).hexdigest()[:24]
    path = cache_dir() / f"hs-{key}.db"
    if os.environ.get("MPDOCTOR_NO_CACHE") != "1":
        try:
            db = hyperscan.loadb(path.read_bytes(), hyperscan.HS_MODE_BLOCK)
            db.scratch = hyperscan.Scratch(db)  # a loaded database comes without one
            return db
        except Exception:  # missing, stale or from another build: compile
            pass
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[e for e, _ in exprs], ids=list(range(len(exprs))), elements=len(exprs),
               flags=[f | hyperscan.HS_FLAG_PREFILTER for _, f in exprs])
    if os.environ.get("MPDOCTOR_NO_CACHE") != "1":
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(hyperscan.dumpb(db))
            os.replace(tmp, path)
        except Exception:
            pass
    return db
