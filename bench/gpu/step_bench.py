"""Step time of a decoder with and without mpdoctor's instrumentation, against
torch.autograd.detect_anomaly and transformers' DebugUnderflowOverflow, as ratios to
the bare step. Run by kit.py in its own process; writes one JSON file.

    python bench/gpu/step_bench.py OUT.json [--device cuda|cpu] [--small] [--steps N]

Model: a GPT-2-small-sized decoder (12 layers, d_model 768, 12 heads, sequence 512,
batch 8; transformers' GPT2LMHeadModel from a config, no download), `--small`: 2 layers,
d_model 64, sequence 32, batch 4. Precisions: bf16 autocast, and fp16 autocast with a
GradScaler. Each configuration trains its own copy of the same initial model (AdamW),
so a sampling watcher keeps its own step count; the configurations take turns step by
step (A B C A B C ...) so that the machine's noise falls on all alike; each step is
timed between two device synchronisations (the bench's, not the instrumentation's).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_model(layers: int, d: int, heads: int, vocab: int, positions: int):
    import torch

    torch.manual_seed(0)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=d, n_layer=layers, n_head=heads,
                         bos_token_id=0, eos_token_id=0)
        cfg.attn_pdrop = cfg.embd_pdrop = cfg.resid_pdrop = 0.0
        return GPT2LMHeadModel(cfg), vocab, "transformers GPT2LMHeadModel"
    except ImportError:
        from torch import nn

        class Decoder(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(vocab, d)
                layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
                self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                self.head = nn.Linear(d, vocab)

            def forward(self, input_ids, labels=None):
                n = input_ids.shape[1]
                mask = torch.nn.Transformer.generate_square_subsequent_mask(n, device=input_ids.device)
                logits = self.head(self.blocks(self.embed(input_ids), mask=mask, is_causal=True))
                loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
                return {"loss": loss, "logits": logits}

        return Decoder(), vocab, "torch TransformerEncoder decoder (transformers not installed)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--device", default=None)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precisions", default="bf16,fp16")
    ap.add_argument("--layers", type=int, help="default 12 (2 with --small)")
    ap.add_argument("--d-model", type=int, help="default 768 (64 with --small)")
    ap.add_argument("--seq", type=int, help="default 512 (32 with --small)")
    ap.add_argument("--batch", type=int, help="default 8 (4 with --small)")
    ap.add_argument("--vocab", type=int, help="default 50257 (512 with --small)")
    ap.add_argument("--threads", type=int, help="torch threads on the CPU (1 is steadier on a shared machine)")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    try:
        import mpdoctor
    except ImportError:  # run from a checkout without the kit's install
        sys.path.insert(0, str(ROOT))
        import mpdoctor
    from mpdoctor.instrument import patches

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    steps = args.steps or (3 if args.small else 10)
    layers = args.layers or (2 if args.small else 12)
    d = args.d_model or (64 if args.small else 768)
    batch = args.batch or (4 if args.small else 8)
    seq = args.seq or (32 if args.small else 512)
    vocab = args.vocab or (512 if args.small else 50257)
    warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled")
    base, vocab, model_name = make_model(layers, d, max(1, d // 64), vocab, max(64, seq))
    n_params = sum(p.numel() for p in base.parameters())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result = {"device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "model": f"{model_name} ({layers} layers, d_model {d})",
              "params": n_params, "batch": batch, "seq": seq,
              "steps": steps, "warmup": args.warmup, "threads": torch.get_num_threads(), "precisions": {}}
    try:
        from transformers.debug_utils import DebugUnderflowOverflow
    except ImportError:
        DebugUnderflowOverflow = None
    ids = torch.randint(0, vocab, (batch, seq), device=device)

    for precision in [p for p in args.precisions.split(",") if p]:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        configs: dict[str, dict] = {}
        for name in ("bare", "mpdoctor", "mpdoctor every=4", "detect_anomaly", "DebugUnderflowOverflow"):
            if name == "DebugUnderflowOverflow" and DebugUnderflowOverflow is None:
                continue
            model = copy.deepcopy(base).to(device)
            cfg = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-5), "times": [],
                   "scaler": torch.amp.GradScaler(device) if precision == "fp16" else None, "watch": None}
            if name.startswith("mpdoctor"):
                cfg["watch"] = mpdoctor.watch(model, every=4 if "every" in name else 1)
                patches.unregister(cfg["watch"])  # registered only for its own steps
            elif name == "DebugUnderflowOverflow":
                DebugUnderflowOverflow(model, max_frames_to_save=21)
            configs[name] = cfg

        def step(name: str, cfg: dict) -> float:
            model, opt, scaler, w = cfg["model"], cfg["opt"], cfg["scaler"], cfg["watch"]
            anomaly = torch.autograd.detect_anomaly(check_nan=True) if name == "detect_anomaly" else None
            sync()
            t = time.perf_counter()
            if w is not None:
                patches.register(w)
            if anomaly is not None:
                anomaly.__enter__()
            try:
                with torch.autocast(device, dtype=dtype):
                    loss = model(input_ids=ids, labels=ids)["loss"]
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
                opt.zero_grad(set_to_none=True)
            finally:
                if anomaly is not None:
                    anomaly.__exit__(None, None, None)
                if w is not None:
                    patches.unregister(w)
            sync()
            return time.perf_counter() - t

        for i in range(args.warmup + steps):
            for name, cfg in configs.items():  # interleaved: A B C A B C ...
                dt = step(name, cfg)
                if i >= args.warmup:
                    cfg["times"].append(dt)
        bare = statistics.median(configs["bare"]["times"])
        rows = {}
        for name, cfg in configs.items():
            med = statistics.median(cfg["times"])
            rows[name] = {"median_ms": round(med * 1000, 3), "ratio": round(med / bare, 3),
                          "best_ms": round(min(cfg["times"]) * 1000, 3),
                          "times_ms": [round(t * 1000, 3) for t in cfg["times"]]}
            w = cfg["watch"]
            if w is not None:
                w.flush()
                rows[name]["internal_errors"] = list(w.internal_errors)
                rows[name]["watched_steps"] = w.step + 1
        result["precisions"][precision] = rows
        for cfg in configs.values():
            if cfg["watch"] is not None:
                patches.register(cfg["watch"])
                cfg["watch"].close()
        del configs
        if device == "cuda":
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=1))
    for precision, rows in result["precisions"].items():
        for name, row in rows.items():
            print(f"{precision:5s} {name:24s} median {row['median_ms']:9.2f} ms  {row['ratio']:.2f}x bare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
