"""Out of memory in a module's forward, with live activations held by earlier modules:
each `Grow` module doubles its input and keeps its output (as a model that logs its
activations would). On CUDA: torch.OutOfMemoryError with the allocator's figures
(expected: cuda-oom; the raw figures are saved to $MPDOCTOR_KIT_OUT/allocator.json to
re-record fixtures/events/cuda-oom-allocator.json). On the CPU: a host allocation that
cannot succeed (expected: cpu-allocator-oom)."""
import json
import os

import torch
from _kit import DEVICE, OUT
from torch import nn


class Grow(nn.Module):
    def forward(self, x):
        self.kept = torch.cat([x, x * 1.0001])  # held on purpose
        return self.kept


class Huge(nn.Module):
    def forward(self, x):  # CPU: 8 TiB at once, refused by the allocator at once
        return x.new_empty(1 << 41)


def save_allocator_figures() -> None:
    try:
        from mpdoctor.instrument import context, patches

        raw = context.read_cuda_allocator(torch)
        w = patches.auto_watcher()
        owners = w.memory_owners() if w is not None else []
        with open(os.path.join(OUT, "allocator.json"), "w") as fh:
            json.dump({"raw": raw, "owners": owners}, fh, indent=1, default=str)
    except Exception as exc:
        print(f"(allocator figures not saved: {type(exc).__name__}: {exc})")


if DEVICE == "cuda":
    free, total = torch.cuda.mem_get_info()
    start = max(1 << 20, free // 64) // 4  # float32 elements: free/64 bytes, doubled until full
    model = nn.Sequential(*[Grow() for _ in range(12)])
    x = torch.ones(start, device=DEVICE)
else:
    model = nn.Sequential(Grow(), Grow(), Huge())
    x = torch.ones(1024)
try:
    model(x)
except torch.OutOfMemoryError:
    save_allocator_figures()
    raise
