"""Several nodes' `mpdoctor run` reports: each node's name, ranks, environment and
precision plan, as the job's evidence holds them (`nodes`), and the node block a run
writes into its report for a shared job folder (`node_block`)."""

from __future__ import annotations

import os
import socket
from typing import Any

# what two nodes of one job should agree on (nodes-differ)
NODE_ENV_KEYS = ("torch", "cuda", "driver", "accelerate", "gpu", "mixed_precision", "python")


def env_summary(env: dict[str, Any], plan: dict[str, Any] | None) -> dict[str, Any]:
    """The facts of one process's environment snapshot (run evidence `env`) two nodes must share."""
    torch = env.get("torch") or {}
    versions = (env.get("packages") or {}).get("versions") or {}
    devices = torch.get("devices") or []
    gpus = sorted({str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name")})
    driver = next((d.get("driver") for d in devices if isinstance(d, dict) and d.get("driver")), None)
    plan = plan or {}
    mixed = plan.get("requested") or (plan.get("autocast_dtype") if plan.get("autocast_enabled") else None) \
        or ("no" if plan.get("autocast_enabled") is False else None)
    out = {"torch": torch.get("version"), "cuda": torch.get("cuda_build"), "driver": driver,
           "accelerate": versions.get("accelerate"), "gpu": ", ".join(gpus) or None,
           "mixed_precision": mixed, "python": (env.get("platform") or {}).get("python")}
    return {k: v for k, v in out.items() if v not in (None, "")}


def node_block(evidence: dict[str, Any], plan: dict[str, Any] | None) -> dict[str, Any]:
    """What a node's run report says of itself in a job: its host, its ranks, its environment."""
    procs = evidence.get("processes") or []
    ranks = sorted({p["rank"] for p in procs if isinstance(p.get("rank"), int)})
    main = next((p for p in procs if p.get("env")), None)
    return {"host": socket.gethostname(), "ranks": ranks,
            "env": env_summary(main.get("env") or {}, plan) if main else {}}


def node_of_report(data: dict[str, Any], source: Any) -> dict[str, Any]:
    """A run report (JSON) as one node of the job."""
    block = data.get("node") if isinstance(data.get("node"), dict) else {}
    name = block.get("name") or block.get("host") or source.node \
        or os.path.splitext(os.path.basename(source.path))[0]
    ranks = block.get("ranks") or sorted(r["rank"] for r in data.get("ranks") or []
                                         if isinstance(r, dict) and isinstance(r.get("rank"), int)
                                         and r.get("pid") is not None)
    env = dict(block.get("env") or {})
    plan = data.get("precision_plan") or {}
    if "mixed_precision" not in env:
        mixed = env_summary({}, plan).get("mixed_precision")
        if mixed:
            env["mixed_precision"] = mixed
    return {"node": str(name), "ranks": ranks, "env": env, "exit_code": data.get("exit_code"),
            "report": source.path}
