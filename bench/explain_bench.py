"""Speed and memory of `mpdoctor explain`, as ratios against the baselines of issue 18.

    python bench/explain_bench.py                  # everything (logs made in /tmp once)
    python bench/explain_bench.py --size-mb 200 --trainer-mb 0 --runs 10 --skip-scan

1. Cold start on a 30-line traceback vs `python -c "import rich.console"` (target <= 1.5x).
2. A training log (step lines, INFO dicts, tqdm lines, warnings) with one traceback near
   the end, at each --size-mb (200 and 500 MB by default), vs `grep -E -i -c` over the
   same file with one literal phrase per rule (target <= 3x), and explain's peak memory
   (target < 200 MB).
3. The same for a Hugging Face Trainer-style log: tqdm bars overwritten with CR (many to
   a line, as a redirected tqdm writes them), loss dicts, eval dicts, one CUDA OOM
   traceback through Trainer frames at the end.
4. The big-log scan without Hyperscan (MPDOCTOR_NO_HYPERSCAN=1, the pure-Python scan)
   vs with it, on the same log (--scan-mb, default 64: target <= 5x).

`--only-start` runs part 1 alone, `--only-scan` part 4 alone; `--skip-scan` leaves part 4
out. Runs are interleaved (baseline, candidate, baseline, ...) and medians are reported,
so a noisy neighbour slows both sides alike. The logs are made in /tmp, never the repo.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

TRACEBACK_30 = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/ana/proj/train.py", line 301, in <module>
[rank0]:     main(cfg)
[rank0]:   File "/home/ana/proj/train.py", line 288, in main
[rank0]:     trainer.fit(model, datamodule=dm)
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py", line 538, in fit
[rank0]:     call._call_and_handle_interrupt(
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/lightning/pytorch/trainer/call.py", line 47, in _call_and_handle_interrupt
[rank0]:     return trainer_fn(*args, **kwargs)
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py", line 574, in _fit_impl
[rank0]:     self._run(model, ckpt_path=ckpt_path)
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py", line 981, in _run
[rank0]:     results = self._run_stage()
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/lightning/pytorch/loops/fit_loop.py", line 205, in run
[rank0]:     self.advance()
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/lightning/pytorch/loops/training_epoch_loop.py", line 250, in advance
[rank0]:     batch_output = self.automatic_optimization.run(trainer.optimizers[0], batch_idx, kwargs)
[rank0]:   File "/home/ana/proj/model.py", line 77, in training_step
[rank0]:     logits = self.net(batch["input_ids"])
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl
[rank0]:     return self._call_impl(*args, **kwargs)
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1762, in _call_impl
[rank0]:     return forward_call(*args, **kwargs)
[rank0]:   File "/home/ana/proj/model.py", line 41, in forward
[rank0]:     h = self.mlp(self.norm(x))
[rank0]:   File "/home/ana/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward
[rank0]:     return F.linear(input, self.weight, self.bias)
[rank0]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.58 GiB of which 1.01 GiB is free. Including non-PyTorch memory, this process has 22.56 GiB memory in use. Of the allocated memory 19.02 GiB is allocated by PyTorch, and 3.09 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""


def training_log(path: Path, size_mb: int) -> Path:
    """A plausible training log: step lines, periodic INFO/eval lines, tqdm bars, a few
    harmless warnings; the traceback near the end. Made once per size (seeded)."""
    if path.exists() and path.stat().st_size >= size_mb * 990_000:
        return path
    rng = random.Random(1234)
    target = size_mb * 1_000_000
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as fh:
        written, step = 0, 0
        while written < target - 200_000:
            block = []
            for _ in range(1000):
                step += 1
                k = step % 97
                if k == 0:
                    line = (f"2024-05-03 11:{step % 60:02d}:{step % 59:02d},{step % 1000:03d} - trainer - INFO - "
                            f"{{'loss': {rng.random() * 3:.4f}, 'grad_norm': {rng.random():.4f}, "
                            f"'learning_rate': {3e-4 * rng.random():.3e}, 'epoch': {step / 1e5:.2f}}}")
                elif k == 1:
                    line = (f"Epoch {step // 10000}:  {step % 100:>2}%|{'█' * (step % 10):<10}| "
                            f"{step % 1000}/1000 [01:{step % 60:02d}<02:10, 4.91it/s, loss={rng.random() * 3:.3f}]")
                elif k == 2 and step % 9700 == 2:
                    line = ("/home/ana/.venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: "
                            "None of the inputs have requires_grad=True. Gradients will be None")
                elif k == 3 and step % 19400 == 3:
                    line = f"[rank0]: eval step {step}: eval_loss {rng.random() * 3:.4f} eval_accuracy {rng.random():.4f}"
                else:
                    line = (f"[rank0]: step {step:>8} | loss {rng.random() * 3:.4f} | lr {3e-4 * rng.random():.3e} | "
                            f"grad_norm {rng.random():.3f} | tokens/s {rng.randint(40000, 60000)} | "
                            f"mem {rng.uniform(18, 22):.1f} GiB")
                block.append(line)
            text = "\n".join(block) + "\n"
            fh.write(text)
            written += len(text.encode())
        fh.write(TRACEBACK_30)
        fh.write("[rank0]: step 0 | loss 0.0 (these lines come after the failure)\n" * 50)
    tmp.replace(path)
    return path


TRAINER_OOM = """\
Traceback (most recent call last):
  File "/home/ana/proj/run_clm.py", line 612, in <module>
    main()
  File "/home/ana/proj/run_clm.py", line 560, in main
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
  File "/home/ana/.venv/lib/python3.11/site-packages/transformers/trainer.py", line 2123, in train
    return inner_training_loop(
  File "/home/ana/.venv/lib/python3.11/site-packages/transformers/trainer.py", line 2481, in _inner_training_loop
    tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
  File "/home/ana/.venv/lib/python3.11/site-packages/transformers/trainer.py", line 3579, in training_step
    loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
  File "/home/ana/.venv/lib/python3.11/site-packages/transformers/trainer.py", line 3633, in compute_loss
    outputs = model(**inputs)
  File "/home/ana/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/home/ana/.venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py", line 853, in forward
    logits = self.lm_head(hidden_states[:, slice_indices, :])
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU 0 has a total capacity of 79.15 GiB of \
which 2.12 GiB is free. Including non-PyTorch memory, this process has 77.02 GiB memory in use. Of the allocated \
memory 71.40 GiB is allocated by PyTorch, and 4.96 GiB is reserved by PyTorch but unallocated. If reserved but \
unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
"""


def trainer_log(path: Path, size_mb: int) -> Path:
    """A Hugging Face Trainer run redirected to a file: tqdm writes its bar with \\r and
    no newline (ten states to a line between two logging steps), the loss dict every
    logging step, an eval dict now and then, a few start-up warnings; the OOM at the end."""
    if path.exists() and path.stat().st_size >= size_mb * 990_000:
        return path
    rng = random.Random(4321)
    target = size_mb * 1_000_000
    total = 10_000_000
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as fh:
        fh.write("[INFO|trainer.py:2314] 2024-05-03 11:02:11,512 >> ***** Running training *****\n"
                 "/home/ana/.venv/lib/python3.11/site-packages/transformers/training_args.py:1575: FutureWarning: "
                 "`evaluation_strategy` is deprecated and will be removed in version 4.46 of Transformers. "
                 "Use `eval_strategy` instead\n")
        written, step = 0, 0
        while written < target - 200_000:
            block = []
            for _ in range(200):
                bars = []
                for _ in range(10):
                    step += 1
                    pct = step * 100 // total
                    bars.append(f"{pct:3d}%|{'█' * (pct // 10):<10}| {step}/{total} "
                                f"[{step // 3600:02d}:{step % 60:02d}<{(total - step) // 3600}:{step % 60:02d}, "
                                f"{rng.uniform(2, 3):.2f}it/s]")
                block.append("\r".join(bars) + "\r")
                block.append(f"{{'loss': {rng.random() * 3:.4f}, 'grad_norm': {rng.random() * 4:.4f}, "
                             f"'learning_rate': {5e-5 * rng.random():.4e}, 'epoch': {step / total * 3:.2f}}}\n")
                if step % 20000 == 0:
                    block.append(f"{{'eval_loss': {rng.random() * 3:.4f}, 'eval_runtime': {rng.uniform(10, 20):.4f}, "
                                 f"'eval_samples_per_second': {rng.uniform(50, 90):.3f}, "
                                 f"'eval_steps_per_second': {rng.uniform(5, 12):.3f}, 'epoch': {step / total * 3:.2f}}}\n")
            text = "".join(block)
            fh.write(text)
            written += len(text.encode())
        fh.write(TRAINER_OOM)
    tmp.replace(path)
    return path


def interleaved(cmds: dict[str, list[str]], runs: int, **kw) -> dict[str, list[float]]:
    """Output goes to a pipe that is read, as a user's would: GNU grep stops at the first
    match when its output is /dev/null, which would make the baseline meaningless."""
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **kw)
            times[name].append(time.perf_counter() - t)
    return times


def peak_rss_mb(cmd: list[str]) -> float:
    """Peak resident memory of a child, polled with psutil (children included)."""
    import psutil

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.01)
    return peak / 1e6


def grep_phrases() -> list[str]:
    """One literal phrase per log rule (its longest required literal), as grep would
    be used to look for what the rule base knows."""
    sys.path.insert(0, str(ROOT))
    from mpdoctor.rulebase import load as load_rules

    phrases = set()
    for rule in load_rules():
        if rule.kind == "log" and rule.literals:
            phrases.add(max(rule.literals, key=len))
    return sorted(phrases)


SCAN_CODE = """
import sys, time
from mpdoctor.rulebase import load
from mpdoctor.logs import prefilter_for, read_log
spec = prefilter_for(load())
t = time.perf_counter()
log = read_log(sys.argv[1], spec)
print(time.perf_counter() - t, log.info["matcher"], log.info.get("regions"))
"""


def scan_ratio(log: Path, runs: int) -> None:
    """The region scan alone (read_log), Hyperscan vs the pure-Python scan, interleaved."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    sides = {"hyperscan": {**env, "MPDOCTOR_NO_HYPERSCAN": "0"}, "python": {**env, "MPDOCTOR_NO_HYPERSCAN": "1"}}
    times: dict[str, list[float]] = {k: [] for k in sides}
    engines: dict[str, str] = {}
    for _ in range(runs):
        for name, e in sides.items():
            out = subprocess.run([PY, "-c", SCAN_CODE, str(log)], capture_output=True, text=True, env=e, cwd=ROOT)
            if out.returncode:
                print(out.stderr[-2000:])
                return
            secs, engine, _regions = out.stdout.split()
            times[name].append(float(secs))
            engines[name] = engine
    h, p = statistics.median(times["hyperscan"]), statistics.median(times["python"])
    size = log.stat().st_size
    print(f"\n4. region scan of a {size / 1e6:.0f} MB training log ({runs} interleaved runs, medians)")
    print(f"   {engines['hyperscan']:<10} scan {h:7.2f} s   ({size / h / 1e6:.0f} MB/s)")
    print(f"   {engines['python']:<10} scan {p:7.2f} s   ({size / p / 1e6:.0f} MB/s)")
    print(f"   ratio python/hyperscan {p / h:.2f}x   (target <= 5x)")


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, nargs="+", default=[200, 500],
                    help="the training log's sizes (part 2, once per size; 0 leaves it out)")
    ap.add_argument("--trainer-mb", type=int, default=None,
                    help="the Trainer-style log's size (part 3; default the largest --size-mb, 0 leaves it out)")
    ap.add_argument("--runs", type=int, default=15, help="cold-start runs per side")
    ap.add_argument("--big-runs", type=int, default=3, help="big-log runs per side")
    ap.add_argument("--log", type=Path, default=None, help="the big log (default /tmp/mpdoctor-bench-<size>MB.log)")
    ap.add_argument("--scan-mb", type=int, default=64, help="log size for the scan ratio (part 4)")
    ap.add_argument("--scan-runs", type=int, default=3)
    ap.add_argument("--only-scan", action="store_true", help="run part 4 only")
    ap.add_argument("--skip-scan", action="store_true", help="leave part 4 out")
    ap.add_argument("--only-start", action="store_true", help="run part 1 only")
    ap.add_argument("--module", action="store_true",
                    help="run `python -m mpdoctor` rather than the installed console script")
    args = ap.parse_args()
    if args.trainer_mb is None:
        args.trainer_mb = max(args.size_mb)
    if args.only_scan:
        scan_log = Path(tempfile.gettempdir()) / f"mpdoctor-bench-{args.scan_mb}MB.log"
        training_log(scan_log, args.scan_mb)
        scan_ratio(scan_log, args.scan_runs)
        return 0

    mpdoctor = [PY, "-m", "mpdoctor"]
    console_script = Path(PY).with_name("mpdoctor")
    if console_script.exists() and not args.module:
        mpdoctor = [str(console_script)]
    # Installed packages have their bytecode compiled (pip does it); a checkout run with
    # PYTHONDONTWRITEBYTECODE would recompile mpdoctor on every start, unlike rich.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, mpdoctor from {ROOT}")
    print(f"command: {' '.join(Path(c).name if i == 0 else c for i, c in enumerate(mpdoctor))} explain LOG; "
          f"bytecode caches on (PYTHONDONTWRITEBYTECODE{' was set, unset' if 'PYTHONDONTWRITEBYTECODE' in os.environ else ' not set'} for the runs)")

    with tempfile.TemporaryDirectory() as tmp:
        tb = Path(tmp) / "traceback.log"
        tb.write_text(TRACEBACK_30)
        for _ in range(2):  # warm the rule cache and the bytecode
            subprocess.run(mpdoctor + ["explain", str(tb)], capture_output=True, env=env)
        times = interleaved({"import rich.console": [PY, "-c", "import rich.console"],
                             "mpdoctor explain": mpdoctor + ["explain", str(tb)]}, args.runs, env=env)
    base, cand = statistics.median(times["import rich.console"]), statistics.median(times["mpdoctor explain"])
    print(f"\n1. cold start, 30-line traceback ({args.runs} interleaved runs, medians)")
    print(f"   python -c 'import rich.console'   {base * 1000:7.1f} ms")
    print(f"   mpdoctor explain traceback.log    {cand * 1000:7.1f} ms")
    print(f"   ratio {cand / base:.2f}x   (target <= 1.5x)")
    if args.only_start:
        return 0

    phrases = grep_phrases()
    pattern = "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", p) for p in phrases)
    tmpdir = Path(tempfile.gettempdir())
    logs = [(2, "training log, one traceback near the end", training_log, mb,
             args.log or tmpdir / f"mpdoctor-bench-{mb}MB.log") for mb in args.size_mb]
    logs.append((3, "Trainer-style log (tqdm \\r bars, loss dicts), one OOM at the end", trainer_log, args.trainer_mb,
                 tmpdir / f"mpdoctor-bench-trainer-{args.trainer_mb}MB.log"))
    for n, kind, make, size_mb, log in logs:
        if size_mb <= 0:
            continue
        t = time.perf_counter()
        make(log, size_mb)
        made = time.perf_counter() - t
        big_log_ratio(n, kind, log, made, pattern, len(phrases), mpdoctor, env, args.big_runs)
    if not args.skip_scan:
        scan_log = tmpdir / f"mpdoctor-bench-{args.scan_mb}MB.log"
        training_log(scan_log, args.scan_mb)
        scan_ratio(scan_log, args.scan_runs)
    return 0


def big_log_ratio(n: int, kind: str, log: Path, made: float, pattern: str, n_phrases: int,
                  mpdoctor: list[str], env: dict[str, str], runs: int) -> None:
    """explain vs grep over one big log, interleaved; explain's peak memory and findings."""
    size = log.stat().st_size
    grep = shutil.which("grep") or "grep"
    cmds = {"grep -E": [grep, "-E", "-i", "-c", pattern, str(log)],
            "mpdoctor explain": mpdoctor + ["explain", str(log), "--format", "json"]}
    subprocess.run(cmds["mpdoctor explain"], capture_output=True, env=env)  # page cache, compiled prefilter
    subprocess.run(cmds["grep -E"], capture_output=True)
    times = interleaved(cmds, runs, env=env)
    g, m = statistics.median(times["grep -E"]), statistics.median(times["mpdoctor explain"])
    rss = peak_rss_mb(cmds["mpdoctor explain"])
    out = subprocess.run(cmds["mpdoctor explain"], capture_output=True, text=True, env=env)
    found = re.findall(r'"rule": "([\w-]+)"', out.stdout)
    print(f"\n{n}. {size / 1e6:.0f} MB {kind} "
          f"({f'made in {made:.0f} s, ' if made > 1 else ''}{runs} interleaved runs, medians)")
    print(f"   grep -E -i ({n_phrases} rule phrases)  {g:7.2f} s   ({size / g / 1e6:.0f} MB/s)")
    print(f"   mpdoctor explain --format json    {m:7.2f} s   ({size / m / 1e6:.0f} MB/s)")
    print(f"   ratio {m / g:.2f}x   (target <= 3x)")
    print(f"   peak memory {rss:.0f} MB   (target < 200 MB)")
    print(f"   findings: {', '.join(found) or 'none'}")

if __name__ == "__main__":
    sys.exit(main())
