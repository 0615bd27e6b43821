"""The installed libraries against each other: accelerate and torch, the declared
requirements of training libraries, cuDNN and the nvidia-* wheels torch pins, and a
torch that does not import."""

from __future__ import annotations

import re
from typing import Any

from ...engine.judge import Hit, Result, Skip, check
from ...knowledge import compat
from ...knowledge.versions import (
    compare,
    cudnn_version,
    parse_requires_dist,
    release,
    satisfies,
)
from ..view import EnvView
from ._common import torch_missing


@check(facts=("accelerate", "spec", "torch_version", "where"))
def accelerate_torch_mismatch(v: EnvView) -> Result:
    acc = v.accelerate
    if not acc:
        return Skip("accelerate is not installed")
    torch_v = v.torch_version
    if not torch_v:
        return Skip("torch is not installed")
    spec, where = None, ""
    for line in v.requires("accelerate"):
        parsed = parse_requires_dist(line)
        if parsed and parsed[0] == "torch" and not parsed[2]:
            spec, where = parsed[1], "packages.requires.accelerate"
    if spec is None:
        spec, where = compat.accelerate_torch_min(acc), "accelerate's setup.py (mpdoctor table)"
    if not spec or satisfies(torch_v, spec) is not False:
        return []
    return [Hit({"accelerate": acc, "torch_version": torch_v, "spec": spec, "where": where},
                [("packages.versions.accelerate", acc), ("packages.versions.torch", torch_v)])]


_CHECKED_DEPS = ("torch", "accelerate", "transformers", "peft", "deepspeed")


@check(facts=("dependency", "installed", "package", "package_version", "spec"))
def library_requirement_unmet(v: EnvView) -> Result:
    hits = []
    for pkg, lines in sorted(v.snap["packages"]["requires"].items()):
        if pkg in ("accelerate", "torch"):
            continue  # accelerate->torch has its own rule; torch's pins are the nvidia-* rule's
        for line in lines:
            parsed = parse_requires_dist(line)
            if not parsed:
                continue
            dep, spec, marker = parsed
            if dep not in _CHECKED_DEPS or not spec:
                continue
            if marker and "extra" in marker and dep != "torch":
                continue  # an optional extra the user may not use (torch extras are real: the library imports it)
            have = v.torch_version if dep == "torch" else v.pkg(dep)
            if not have:
                continue
            if satisfies(have, spec) is False:
                hits.append(Hit({"package": pkg, "package_version": v.pkg(pkg), "dependency": dep,
                                 "spec": spec, "installed": have},
                                [(f"packages.requires.{pkg}", line), (f"packages.versions.{dep}", have)]))
    return hits


def _torch_pins(v: EnvView) -> dict[str, str]:
    pins = {}
    for line in v.requires("torch"):
        parsed = parse_requires_dist(line)
        if parsed and parsed[0].startswith("nvidia-") and parsed[1].startswith("=="):
            pins[parsed[0]] = parsed[1][2:]
    return pins


@check(facts=("detail", "pin", "wheel", "wheel_name"))
def cudnn_mismatch(v: EnvView) -> Result:
    if v.hip_build:
        return Skip("ROCm build: no cuDNN")
    hits = []
    err = ((v.torch.get("errors") or {}).get("cudnn") or {}).get("message") if v.torch_ok else None
    wheel_name = next((n for n in v.snap["packages"]["nvidia_wheels"] if n.startswith("nvidia-cudnn")), None)
    wheel = v.snap["packages"]["nvidia_wheels"].get(wheel_name) if wheel_name else None
    runtime = v.torch.get("cudnn") if v.torch_ok else None
    pin = _torch_pins(v).get(wheel_name or "") if wheel_name else None
    if err:
        hits.append(Hit({"detail": err, "wheel": wheel, "wheel_name": wheel_name},
                        [("torch.errors.cudnn", err)]))
    elif runtime and wheel:
        rt = (release(cudnn_version(runtime)) or (0, 0))[:2]
        wr = (release(wheel) or (0, 0))[:2]
        if tuple(wr) != rt:
            hits.append(Hit({"detail": f"torch loaded cuDNN {rt[0]}.{rt[1]} but {wheel_name} {wheel} is installed",
                             "wheel": wheel, "wheel_name": wheel_name, "runtime": f"{rt[0]}.{rt[1]}"},
                            [("torch.cudnn", runtime), (f"packages.nvidia_wheels.{wheel_name}", wheel)]))
    if not hits and pin and wheel and (release(pin) or (0,))[0] != (release(wheel) or (0,))[0]:
        hits.append(Hit({"detail": f"torch {v.torch_version} pins {wheel_name}=={pin}, installed is {wheel}",
                         "wheel": wheel, "wheel_name": wheel_name, "pin": pin},
                        [("packages.requires.torch", f"{wheel_name}=={pin}"),
                         (f"packages.nvidia_wheels.{wheel_name}", wheel)]))
    return hits


@check(facts=("installed", "pin", "torch_version", "wheel_name"))
def nvidia_wheel_pin_mismatch(v: EnvView) -> Result:
    pins = _torch_pins(v)
    if not pins:
        return Skip("torch declares no nvidia-* pins (not a pip CUDA wheel)")
    hits = []
    wheels = v.snap["packages"]["nvidia_wheels"]
    for name, pin in sorted(pins.items()):
        have = wheels.get(name)
        if have is None:
            continue  # a missing library is the import rule's business
        if name.startswith("nvidia-cudnn") and (release(pin) or (0,))[0] != (release(have) or (0,))[0]:
            continue  # a cuDNN major mismatch is cudnn-version-mismatch
        if compare(have, pin) != 0:
            hits.append(Hit({"wheel_name": name, "pin": pin, "installed": have, "torch_version": v.torch_version},
                            [("packages.requires.torch", f"{name}=={pin}"), (f"packages.nvidia_wheels.{name}", have)]))
    return hits


_LIB_MISSING = re.compile(r"(lib[\w.+-]*\.so[\w.]*|[\w-]+\.dll)|undefined symbol|cannot open shared object|DLL load failed",
                          re.IGNORECASE)


def _torch_failure(v: EnvView) -> tuple[str, dict[str, Any]] | None:
    status = v.torch.get("status")
    if status in ("ok", "not-installed", "unknown", None):
        return None
    err = v.torch.get("error") or {}
    return status, err


@check(facts=("exception", "library", "message", "pin", "torch_version", "wheel_name", "wheel_state"))
def torch_import_missing_library(v: EnvView) -> Result:
    if (missing := torch_missing(v)):
        return Skip(missing)
    failed = _torch_failure(v)
    if not failed:
        return []
    status, err = failed
    message = str(err.get("message", ""))
    m = _LIB_MISSING.search(message)
    if status != "import-error" or not m:
        return []
    lib = m.group(1)
    facts = {"message": message.splitlines()[0][:300], "library": lib, "exception": err.get("type"),
             "torch_version": v.pkg("torch")}
    wheels = v.snap["packages"]["nvidia_wheels"]
    pins = _torch_pins(v)
    if lib:
        stem = re.sub(r"^lib|\.so.*$|\.dll$", "", lib).lower()
        family = {"cudart": "cuda-runtime", "cublas": "cublas", "cublaslt": "cublas", "cudnn": "cudnn",
                  "nccl": "nccl", "nvjitlink": "nvjitlink", "cusparse": "cusparse", "cufft": "cufft",
                  "curand": "curand", "cusolver": "cusolver", "nvrtc": "cuda-nvrtc", "cupti": "cuda-cupti",
                  "cusparselt": "cusparselt", "nvtoolsext": "nvtx", "cufile": "cufile"}.get(re.sub(r"\d+$", "", stem))
        if family:
            want = [n for n in pins if n.startswith(f"nvidia-{family}-")]
            if want:
                facts["wheel_name"] = want[0]
                facts["pin"] = pins[want[0]]
                facts["wheel_state"] = f"installed {wheels[want[0]]}" if want[0] in wheels else "not installed"
    return [Hit(facts, [("torch.error.message", message.splitlines()[0][:300])])]


@check(facts=("exception", "message", "status", "stderr", "torch_version"))
def torch_unusable(v: EnvView) -> Result:
    if (missing := torch_missing(v)):
        return Skip(missing)
    failed = _torch_failure(v)
    if not failed:
        return []
    status, err = failed
    facts = {"status": status, "exception": err.get("type"), "message": str(err.get("message", "")).splitlines()[0][:300]
             if err.get("message") else None, "torch_version": v.pkg("torch"),
             "stderr": (v.torch.get("stderr_tail") or [None])[-1]}
    return [Hit(facts, [("torch.status", status)] + ([("torch.error.message", facts["message"])] if facts["message"] else []))]
