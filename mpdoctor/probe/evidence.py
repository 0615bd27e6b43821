"""One probe mode's evidence: the child's measurements next to the fp32 child's, as
the probe rules (rules/probe/*.toml) and the env and run rules judge them.

A recorded mode (`MPDOCTOR_SAVE_PROBE=DIR` writes DIR/probe-<mode>.json; the fixtures
under fixtures/probe/ were recorded so) is:

    {"schema": 1, "mode": "fp16", "options": {"stress": false, ...},
     "result": {...the mode child's JSON...}, "base": {...the fp32 child's JSON...} | null}

Pure Python: no torch here.
"""

from __future__ import annotations

import json
from typing import Any

SCHEMA = 1
FP16_MAX = 65504.0
# The dtype the first matmul must produce for a mode to count as having run.
EXPECTED_DTYPE = {"no": "float32", "fp16": "float16", "bf16": "bfloat16"}

# Facts the probe adds to an env rule it judges on a mode's environment.
OBSERVED_FACTS: dict[str, str] = {
    "speedup": "probe: the mode's step time against fp32's, measured here (e.g. 0.51x)",
    "memory_saving": "probe: the mode's peak memory saving against fp32, measured here",
    "torch_autocast_fp16_dtype": "probe: what torch's own CPU fp16 autocast produced on the same model",
}


class ProbeView:
    def __init__(self, evidence: dict[str, Any]):
        self.evidence = evidence
        self.mode: str = evidence.get("mode") or "no"
        self.result: dict[str, Any] = evidence.get("result") or {}
        self.base: dict[str, Any] | None = evidence.get("base")
        self.options: dict[str, Any] = evidence.get("options") or {}

    @property
    def observed(self) -> dict[str, Any]:
        return self.result.get("observed") or {}

    @property
    def device(self) -> dict[str, Any]:
        return self.result.get("device") or {}

    @property
    def autocast_dtype(self) -> str | None:
        return self.result.get("autocast_dtype")

    @property
    def ran_as_requested(self) -> bool:
        if self.mode == "fp8":
            return (self.result.get("fp8_modules") or 0) > 0
        return self.autocast_dtype == EXPECTED_DTYPE.get(self.mode)

    @property
    def speedup(self) -> float | None:
        """The row's speed-up (paired round by round when timed in rounds); None when it
        did not run as asked or its rounds did not make it reliable: a rule quotes
        only a figure that holds."""
        if not self.ran_as_requested:
            return None
        from .stability import SPEED_THRESHOLDS, figure, round_ratios

        base_rounds = [min(t) for t in ((self.base or {}).get("round_times_s") or []) if t]
        mine = [min(t) for t in (self.result.get("round_times_s") or []) if t]
        if base_rounds and mine:
            fig = figure(round_ratios(base_rounds, mine), SPEED_THRESHOLDS)
            return fig.value if fig.reliable else None
        b, t = (self.base or {}).get("step_time_s"), self.result.get("step_time_s")
        return b / t if b and t else None


def probe_evidence(mode: str, result: dict[str, Any], base: dict[str, Any] | None,
                   options: dict[str, Any]) -> dict[str, Any]:
    return {"schema": SCHEMA, "mode": mode, "options": options, "result": result, "base": base}


class ProbeEvidenceError(ValueError):
    pass


def read_probe_evidence(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ProbeEvidenceError(f"{path}: cannot be read as probe evidence ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("result"), dict):
        raise ProbeEvidenceError(f"{path}: not a probe evidence file (schema {SCHEMA})")
    return data
