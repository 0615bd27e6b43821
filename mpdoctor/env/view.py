"""What the rules read: a snapshot seen through the questions they ask.

EnvView is derived from the snapshot dict alone (plus the precision being judged),
so a predicate stays a pure function of the snapshot. It merges the two views of
the GPUs (torch's and NVML's), finds where accelerate would put the model, and keeps
the snapshot path of every value so that findings can cite it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..knowledge import compat
from ..knowledge.compat import Capability, parse_cc
from ..knowledge.versions import at_least


@dataclass
class Gpu:
    index: int
    name: str
    cc: Capability | None
    cc_path: str
    total_memory_bytes: int | None = None
    vendor: str = "nvidia"
    gcn_arch: str | None = None
    bf16_supported: bool | None = None   # torch.cuda.is_bf16_supported() (emulation counts)
    bf16_native: bool | None = None      # ... including_emulation=False
    torch_sees: bool = True
    nvml: dict[str, Any] | None = None
    nvml_path: str | None = None

    @property
    def sm(self) -> str | None:
        return compat.sm(self.cc) if self.cc else None

    @property
    def cc_text(self) -> str | None:
        return f"{self.cc[0]}.{self.cc[1]}" if self.cc else None

    @property
    def arch(self) -> str | None:
        if self.vendor == "amd":
            row = compat.rocm_target(self.gcn_arch)
            return row["name"] if row else self.gcn_arch
        return compat.arch_name(self.cc, self.name)

    @property
    def label(self) -> str:
        """"Tesla V100-SXM2-16GB (sm_70)" — how findings name a GPU."""
        if self.vendor == "amd":
            return f"{self.name} ({(self.gcn_arch or '?').split(':')[0]})"
        return f"{self.name} ({self.sm})" if self.sm else self.name


def _uuid(value: Any) -> str | None:
    if not value:
        return None
    text = str(value).lower()
    return text[4:] if text.startswith("gpu-") else text


def parse_visible_devices(value: str | None, gpus: list[dict[str, Any]]) -> tuple[list[int] | None, list[str]]:
    """CUDA_VISIBLE_DEVICES -> (the NVML indices CUDA will show, the entries it cannot find).

    CUDA stops at the first entry it cannot resolve (so "0,7" on a 4-GPU machine shows
    GPU 0 only); an empty value or "-1" hides every GPU. None: the variable is unset.
    """
    if value is None:
        return None, []
    entries = [e.strip() for e in value.split(",")]
    if value.strip() == "":
        return [], []
    shown: list[int] = []
    invalid: list[str] = []
    uuids = {_uuid(g.get("uuid")): g.get("index") for g in gpus if g.get("uuid")}
    stop = False
    for e in entries:
        if stop:
            invalid.append(e)
            continue
        idx: int | None = None
        if e.lstrip("-").isdigit():
            n = int(e)
            if 0 <= n < len(gpus):
                idx = n
        else:
            low = _uuid(e) or ""
            for u, i in uuids.items():
                if u and (u == low or u.startswith(low)) and len(low) >= 4:
                    idx = i
                    break
            if e.upper().startswith("MIG-"):
                idx = -1  # a MIG instance: CUDA resolves it; NVML lists only the parent
        if idx is None:
            invalid.append(e)
            stop = True
        elif idx >= 0 and idx not in shown:
            shown.append(idx)
    return shown, invalid


@dataclass
class EnvView:
    snap: dict[str, Any]
    requested: str | None = None
    plan: Any = None  # plan.PrecisionPlan, set by judge()
    # what a run or the probe saw this environment do (observed_dtype, ...), when judged there
    observed: dict[str, Any] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gpus = self._merge_gpus()

    # --- raw sections ---
    @property
    def torch(self) -> dict[str, Any]:
        return self.snap["torch"]

    @property
    def nvml(self) -> dict[str, Any]:
        return self.snap["nvml"]

    @property
    def env(self) -> dict[str, str]:
        return self.snap["env"]

    @property
    def torch_ok(self) -> bool:
        return self.torch.get("status") == "ok"

    @property
    def torch_version(self) -> str | None:
        return self.torch.get("version") or self.pkg("torch")

    @property
    def cuda_build(self) -> str | None:
        return self.torch.get("cuda_build") if self.torch_ok else None

    @property
    def hip_build(self) -> str | None:
        return self.torch.get("hip_build") if self.torch_ok else None

    @property
    def cuda_available(self) -> bool:
        return bool(self.torch_ok and self.torch.get("cuda_available"))

    @property
    def nvml_ok(self) -> bool:
        return self.nvml.get("status") == "ok"

    @property
    def nvml_gpus(self) -> list[dict[str, Any]]:
        return self.nvml.get("gpus", []) if self.nvml_ok else []

    @property
    def windows(self) -> bool:
        return str(self.snap["platform"].get("system", "")).lower().startswith("win")

    def pkg(self, name: str) -> str | None:
        return self.snap["packages"]["versions"].get(name)

    def requires(self, name: str) -> list[str]:
        return list(self.snap["packages"]["requires"].get(name) or [])  # null: nothing declared

    @property
    def accelerate(self) -> str | None:
        return self.pkg("accelerate")

    @property
    def config_section(self) -> dict[str, Any]:
        return self.snap["accelerate_config"]

    @property
    def config(self) -> dict[str, Any] | None:
        c = self.config_section.get("config")
        return c if isinstance(c, dict) else None

    @property
    def mps_available(self) -> bool:
        return bool(self.torch_ok and (self.torch.get("mps") or {}).get("available"))

    @property
    def use_cpu(self) -> bool:
        cfg = self.config or {}
        return bool(cfg.get("use_cpu")) or str(self.env.get("ACCELERATE_USE_CPU", "")).lower() in ("1", "true", "yes")

    @property
    def device(self) -> str:
        """Where accelerate would place the model: cuda, mps or cpu."""
        if self.use_cpu:
            return "cpu"
        if self.cuda_available and self.torch.get("device_count", 0):
            return "cuda"
        if self.mps_available:
            return "mps"
        return "cpu"

    @property
    def rocm(self) -> bool:
        return bool(self.hip_build)

    @property
    def visible_gpu_count(self) -> int | None:
        if self.cuda_available:
            return int(self.torch.get("device_count") or 0)
        if self.nvml_ok:
            shown, _ = parse_visible_devices(self.env.get("CUDA_VISIBLE_DEVICES"), self.nvml_gpus)
            return len(self.nvml_gpus) if shown is None else len(shown)
        return None

    def _merge_gpus(self) -> list[Gpu]:
        nv = self.nvml_gpus
        devices = self.torch.get("devices", []) if self.torch_ok else []
        out: list[Gpu] = []
        if devices:
            shown, _ = parse_visible_devices(self.env.get("CUDA_VISIBLE_DEVICES"), nv)
            by_uuid = {_uuid(g.get("uuid")): (i, g) for i, g in enumerate(nv) if g.get("uuid")}
            for pos, d in enumerate(devices):
                if "error" in d and "name" not in d:
                    continue
                match = by_uuid.get(_uuid(d.get("uuid"))) if d.get("uuid") else None
                if match is None and nv:
                    order = shown if shown is not None else list(range(len(nv)))
                    if pos < len(order) and order[pos] < len(nv):
                        match = (order[pos], nv[order[pos]])
                index = d.get("index")
                gpu = Gpu(index=index if isinstance(index, int) else pos, name=str(d.get("name") or "GPU"),
                          cc=parse_cc(d.get("capability")), cc_path=f"torch.devices[{pos}].capability",
                          total_memory_bytes=d.get("total_memory_bytes"),
                          vendor="amd" if (d.get("gcn_arch") or self.hip_build) else "nvidia",
                          gcn_arch=d.get("gcn_arch"), bf16_supported=d.get("bf16_supported"),
                          bf16_native=d.get("bf16_native"), torch_sees=True)
                if match is not None:
                    gpu.nvml, gpu.nvml_path = match[1], f"nvml.gpus[{match[0]}]"
                out.append(gpu)
            return out
        for i, g in enumerate(nv):
            if "error" in g and "name" not in g:
                continue
            cc = parse_cc(g.get("capability"))
            path = f"nvml.gpus[{i}].capability"
            if cc is None:
                row = compat.gpu_by_name(g.get("name"))
                cc = parse_cc(row["cc"]) if row else None
                path = f"nvml.gpus[{i}].name"
            mem = (g.get("memory") or {}).get("total_bytes")
            index = g.get("index")
            out.append(Gpu(index=index if isinstance(index, int) else i, name=str(g.get("name") or "GPU"), cc=cc,
                           cc_path=path,
                           total_memory_bytes=mem, torch_sees=False, nvml=g, nvml_path=f"nvml.gpus[{i}]"))
        return out

    @property
    def cuda_gpus(self) -> list[Gpu]:
        """The NVIDIA GPUs torch will compute on (capability rules apply to these)."""
        if self.device != "cuda":
            return []
        return [g for g in self.gpus if g.vendor == "nvidia" and g.torch_sees and g.cc]

    def torch_at_least(self, version: str) -> bool | None:
        return at_least(self.torch_version, version)
