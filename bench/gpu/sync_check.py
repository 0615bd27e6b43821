"""Host synchronisations inside a watched step, counted two ways (writes one JSON file):

* Python-level host reads (`.item()`, `.tolist()`, `.cpu()`, `bool(t)`, `float(t)`, ...,
  `torch.cuda.synchronize()`), watched step against the bare step: the design allows
  one read per step (the watcher's flush);
* on CUDA, `torch.cuda.set_sync_debug_mode("warn")`: every synchronising CUDA call warns;
  the warnings of a watched step against the bare step's.

    python bench/gpu/sync_check.py OUT.json [--device cuda|cpu] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    import torch
    from torch import nn

    try:
        import mpdoctor
    except ImportError:
        sys.path.insert(0, str(ROOT))
        import mpdoctor

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    reads = {"n": 0}

    def counting(original):
        def wrapper(*a, **k):
            reads["n"] += 1
            return original(*a, **k)
        return wrapper

    for name in _READS:
        setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    torch.cuda.synchronize = counting(torch.cuda.synchronize)
    debug = device == "cuda" and hasattr(torch.cuda, "set_sync_debug_mode")

    d = 256 if device == "cuda" else 32  # fp16 matmuls are emulated (slow) on most CPUs

    def make():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU())
                               for _ in range(8)], nn.Linear(d, 1)).to(device)

    def run(model, steps: int) -> tuple[list[int], list[int]]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler(device)
        x = torch.randn(32, d, device=device)
        py, cu = [], []
        for _ in range(steps):
            before = reads["n"]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if debug:
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    with torch.autocast(device, dtype=torch.float16):
                        loss = model(x).float().pow(2).mean()
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                finally:
                    if debug:
                        torch.cuda.set_sync_debug_mode(0)
            py.append(reads["n"] - before)
            cu.append(sum(1 for w in caught if "synchroniz" in str(w.message)))
        return py, cu

    bare_py, bare_cu = run(make(), args.steps)
    model = make()
    with mpdoctor.watch(model) as h:
        py, cu = run(model, args.steps)
    extra_py = [a - b for a, b in zip(py, bare_py)]
    extra_cu = [a - b for a, b in zip(cu, bare_cu)]
    result = {"device": device, "steps": args.steps, "sync_debug_mode": debug,
              "python_reads": {"bare": bare_py, "watched": py, "extra": extra_py},
              "cuda_sync_warnings": {"bare": bare_cu, "watched": cu, "extra": extra_cu} if debug else None,
              "internal_errors": list(h.internal_errors),
              "ok": max(extra_py) <= 1 and (not debug or max(extra_cu) <= 1)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"extra host reads per watched step: {extra_py}" +
          (f"; extra CUDA syncs per step: {extra_cu}" if debug else " (CUDA sync debug mode: n/a)"))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
