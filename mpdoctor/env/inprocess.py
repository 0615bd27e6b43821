"""The environment of a process that is training, read from inside it.

`mpdoctor run` and the probe judge the env rules on the environment a run really had:
this process's torch (already imported: nothing new is loaded and no CUDA context is
created), its installed libraries, its environment variables, the host. The result has
the snapshot's shape (docs/snapshot-schema.md, without NVML and the accelerate config
file, which the run's own Accelerator replaces), so the env rules read it unchanged.
"""

from __future__ import annotations

from typing import Any


def collect_in_process() -> dict[str, Any]:
    """A snapshot-shaped dict of this process's environment. Never raises."""
    out: dict[str, Any] = {"schema": 1, "source": "in-process"}
    for key, fn in (("torch", _torch), ("packages", _packages), ("env", _env), ("platform", _platform),
                    ("cpu", _cpu)):
        try:
            out[key] = fn()
        except Exception as exc:  # one part missing is still evidence
            out[key] = {"error": {"type": type(exc).__name__, "message": str(exc)[:300]}}
    return out


def _torch() -> dict[str, Any]:
    from .torch_child import collect

    return collect(in_process=True)


def _packages() -> dict[str, Any]:
    from .packages import collect_packages

    return collect_packages()


def _env() -> dict[str, Any]:
    from .accel_config import collect_env_vars

    return collect_env_vars()


def _platform() -> dict[str, Any]:
    from .host import collect_platform

    return collect_platform()


def _cpu() -> dict[str, Any]:
    from .host import collect_cpu

    return collect_cpu()
