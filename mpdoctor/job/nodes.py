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
    per_node = _nproc_per_node(evidence.get("command") or [])
    if per_node and ranks:  # torchrun numbers a node's ranks in one block: a rank that left no record is in it
        base = ranks[0] - ranks[0] % per_node
        ranks = list(range(base, base + per_node))
    out = {"host": socket.gethostname(), "ranks": ranks,
           "env": env_summary(main.get("env") or {}, plan) if main else {}}
    if per_node:
        out["local_world_size"] = per_node
    return out


def _nproc_per_node(cmd: list[str]) -> int | None:
    """torchrun's / accelerate's processes per node from the launcher's command line
    (accelerate's --num_processes counts every machine's: divided by --num_machines)."""
    def value_of(*flags: str) -> int | None:
        for i, arg in enumerate(cmd):
            for flag in flags:
                v = arg[len(flag) + 1:] if arg.startswith(flag + "=") else (
                    cmd[i + 1] if arg == flag and i + 1 < len(cmd) else None)
                if v is not None and v.isdigit() and int(v) > 0:
                    return int(v)
        return None

    total, machines = value_of("--num_processes", "--num-processes"), value_of("--num_machines", "--num-machines")
    if total and machines and total % machines == 0:
        return total // machines
    for i, arg in enumerate(cmd):
        for flag in ("--nproc-per-node", "--nproc_per_node", "--num_processes_per_node"):
            value = arg[len(flag) + 1:] if arg.startswith(flag + "=") else (
                cmd[i + 1] if arg == flag and i + 1 < len(cmd) else None)
            if value is not None and value.isdigit() and int(value) > 0:
                return int(value)
    return None


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
    out = {"node": str(name), "ranks": ranks, "env": env, "exit_code": data.get("exit_code"), "report": source.path}
    if isinstance(block.get("local_world_size"), int):
        out["local_world_size"] = block["local_world_size"]
    return out
