"""Rule priorities are a few tiers (rules/README.md), not numbers tuned per paste; where
one rule must win over another that fires on the same log, `supersedes` says so."""

from __future__ import annotations

from mpdoctor import rulebase

RULES = rulebase.load()
BY_ID = {r.id: r for r in RULES}
# 90 job-wide conclusion, 80 specific cause, 60 cause, 40 generic (the default), 20 catch-all / echo /
# notice, 5 summary or note
TIERS = (90, 80, 60, 40, 20, 5)
# Rules whose files are being edited elsewhere and still carry a finer number (a baseline:
# it only shrinks; a listed rule that is on a tier fails until it is removed from here).
NOT_ON_A_TIER_YET: frozenset[str] = frozenset()


def test_every_priority_is_a_tier():
    off = sorted(f"{r.id}: {r.priority}" for r in RULES if r.priority not in TIERS and r.id not in NOT_ON_A_TIER_YET)
    assert not off, f"priority must be one of {TIERS} (rules/README.md), not: {off}"
    stale = sorted(i for i in NOT_ON_A_TIER_YET if i in BY_ID and BY_ID[i].priority in TIERS)
    assert not stale, f"on a tier now, remove from NOT_ON_A_TIER_YET: {stale}"


def test_tiers_are_few():
    assert len({r.priority for r in RULES if r.id not in NOT_ON_A_TIER_YET}) <= len(TIERS)


def test_supersedes_names_other_existing_rules():
    bad = sorted(f"{r.id} -> {o}" for r in RULES for o in r.supersedes if o == r.id or o not in BY_ID)
    assert not bad, f"supersedes must name another rule that exists: {bad}"


def test_a_supersedes_chain_has_no_cycle():
    def reach(start: str) -> set[str]:
        seen, todo = set(), list(BY_ID[start].supersedes)
        while todo:
            o = todo.pop()
            if o in seen or o not in BY_ID:
                continue
            seen.add(o)
            todo.extend(BY_ID[o].supersedes)
        return seen

    cycles = sorted(r.id for r in RULES if r.id in reach(r.id))
    assert not cycles, f"rules that supersede themselves through others: {cycles}"
