"""What the instrumentation finds, as plain data (no torch here: the wrapper reads the
same records back from the events files)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class NonFinite:
    """Where a NaN/Inf first appeared in one phase."""

    module: str                    # qualified name relative to the outermost module called
    phase: str                     # "forward" | "backward"
    step: int                      # 0-based optimizer step (see instrument/steps.py)
    dtype: str                     # dtype of the tensor that went non-finite
    kind: str                      # "nan" | "inf"
    module_type: str = ""
    # The range of the module's input in that call (forward) or of the gradient it got
    # from above (backward); None when it could not be read.
    input_min: float | None = None
    input_max: float | None = None
    input_dtype: str | None = None
    # "module": the module made it from finite input; "input": the input already was
    # non-finite (the data, or functional code between modules); "loss": the loss
    # computed outside any module; "param-grad": only a parameter's gradient.
    origin: str = "module"
    steps_affected: int = 1
    # The largest finite |value| a watched module had output before it (over the run so
    # far), the module and its dtype: how close the run was to the dtype's range.
    seen_absmax: float | None = None
    seen_module: str | None = None
    seen_dtype: str | None = None
    # a parameter of that module already non-finite when it ran (an optimizer step broke
    # it: the module did not make the NaN from good weights); read once, at the first one
    param: str | None = None
    param_dtype: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OverflowWarning:
    module: str
    step: int
    dtype: str
    absmax: float
    limit: float
    module_type: str = ""
    also: list[str] = field(default_factory=list)   # modules the large values reached next

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScalerTimeline:
    """The dynamic loss scale, one entry per scaler.update()."""

    scales: list[tuple[int, float]] = field(default_factory=list)   # (step, scale after update)
    skipped_steps: list[int] = field(default_factory=list)
    initial_scale: float | None = None
    # Kept short: a run of a million steps must not keep a million entries.
    max_entries: int = 2000

    @property
    def final_scale(self) -> float | None:
        return self.scales[-1][1] if self.scales else self.initial_scale

    @property
    def updates(self) -> int:
        return self._updates

    _updates: int = 0

    def add(self, step: int, before: float, after: float) -> None:
        self._updates += 1
        if self.initial_scale is None:
            self.initial_scale = before
        if len(self.scales) < self.max_entries:
            self.scales.append((step, after))
        else:
            self.scales[-1] = (step, after)
        if after < before and len(self.skipped_steps) < self.max_entries:
            self.skipped_steps.append(step)

    def longest_skip_run(self) -> int:
        best = run = 0
        prev = None
        for s in self.skipped_steps:
            run = run + 1 if prev is not None and s == prev + 1 else 1
            best = max(best, run)
            prev = s
        return best

    def to_dict(self) -> dict[str, Any]:
        return {"scales": [list(x) for x in self.scales], "skipped_steps": list(self.skipped_steps),
                "initial_scale": self.initial_scale, "final_scale": self.final_scale,
                "updates": self._updates}


@dataclass
class PrecisionPlan:
    """The precision the run really used, next to what was asked for."""

    requested: str | None = None            # accelerate's mixed_precision, if any
    autocast_dtype: str | None = None       # output dtype of the first Linear/conv seen
    autocast_enabled: bool | None = None    # was autocast on at that moment
    autocast_module: str | None = None
    # {"trainable": {"float32": elements}, "frozen": {...}}: only what is trained (the
    # optimizer's parameters, the modules accelerate prepared), not every module called
    params: dict[str, dict[str, int]] = field(default_factory=dict)
    grad_scaler: bool = False
    grad_scaler_enabled: bool | None = None
    optimizer_param_dtypes: dict[str, int] = field(default_factory=dict)
    fp32_master_weights: bool | None = None
    distributed_type: str | None = None
    num_processes: int | None = None
    device: str | None = None                # the device type of the trained parameters
    optimizers: list[str] = field(default_factory=list)   # class names, in order seen
    optimizer_eps: float | None = None       # the smallest eps of an Adam-family optimizer
    prepared: dict[str, bool] = field(default_factory=dict)
    # pure low-precision training: fraction of sampled weights an optimizer step left equal
    unchanged_fraction: float | None = None
    unchanged_sampled: int | None = None
    # every place that asked for a precision (knowledge.intent's codes): {"source", "value", "where"}
    sources: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RaisedError:
    """An exception raised inside the training, as it was, with the context a traceback
    does not show. Not classified here: the parent explains it with the rule base."""

    exception: str                # "RuntimeError: mat1 and mat2 must have the same dtype ..." (whole, bounded)
    module: str = ""              # the module whose forward raised; "" when outside any module
    module_type: str = ""
    step: int = -1                # the optimizer step (0-based) it was raised in
    micro: int | None = None      # the training forward (micro-batch) within that step
    # params: {"float16@cpu": tensors}; inputs: [{dtype, device, shape}]; autocast:
    # {"cpu": "bfloat16"} when on; memory: {"host": {...}, "device": {...}}; batch_shape
    context: dict[str, Any] = field(default_factory=dict)
    time: float = 0.0
    # caught by the program, which then completed an optimizer step (this one): not the
    # run's failure (an OOM retried with a smaller batch)
    recovered_at_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
