"""mpdoctor's GPU kit: one command that proves every face on a CUDA machine and measures
the instrumentation's cost there, without network, in under 8 minutes.

    bash bench/gpu/run.sh OUTDIR                       # on the GPU machine
    bash bench/gpu/run.sh OUTDIR --device cpu --small  # the dry run (tests/test_gpu_kit.py)

What it does, each step in its own process with a timeout (a failure is recorded in the
summary and the kit goes on):

1. env: the interpreter, torch (its file and version: the kit checks at the end that
   nothing changed them), the GPUs;
2. install: mpdoctor's core for this interpreter without touching its torch:
   `pip install --no-deps --no-index --target OUTDIR/site` of the tree and of the pure
   wheels carried in bench/gpu/wheels/ (rich, markdown-it-py, mdurl, pygments,
   nvidia-ml-py; hatchling and its dependencies to build the tree); where pip cannot,
   PYTHONPATH=the checkout plus those wheels (zip imports). The summary says which;
3. check and collect (JSON kept); probe in every mode (fp16 with accelerate's
   GradScaler, bf16, fp8 where a backend imports);
4. `mpdoctor run` on the scripts of bench/gpu/scripts/: fp16 with a GradScaler that
   skips steps, an out-of-memory with the allocator's figures, a dtype mismatch, a
   device mismatch, two ranks when two GPUs are visible;
5. sync: host synchronisations inside a watched step (sync_check.py);
6. bench: the step time of a GPT-2-small-sized decoder in bf16 and in fp16 with a
   GradScaler: bare, mpdoctor (every step, every 4th), detect_anomaly,
   DebugUnderflowOverflow, interleaved (step_bench.py), run alone at the end.

Everything lands in OUTDIR, with summary.md (the tables) and summary.json. Standard
library only: the driver runs before anything is installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WHEELS = HERE / "wheels"
SCRIPTS = HERE / "scripts"
# the wheels mpdoctor needs at run time that a machine with torch and accelerate may lack
# (accelerate already requires psutil, pyyaml and packaging)
RUNTIME = ("rich", "markdown_it_py", "mdurl", "pygments", "nvidia_ml_py")
# only when the interpreter lacks them
RUNTIME_IF_MISSING = {"packaging": "packaging", "tomli": "tomli"}

# script -> (what it shows, the rule ids of which one must be found)
RUNS = {
    "fp16_scaler_overflow": ("fp16 + GradScaler skipping steps", ["scaler-skipping-steps", "scaler-collapsed"]),
    "oom": ("out of memory with the allocator's figures", ["cuda-oom", "cpu-allocator-oom", "host-allocation-failed"]),
    "dtype_mismatch": ("a half submodule fed float32", ["matmul-operands-dtype", "input-weight-dtype"]),
    "device_mismatch": ("a submodule left on another device",
                        ["tensors-on-different-devices", "input-weight-device"]),
    "two_ranks": ("two ranks (NCCL), rank 1 fails", ["rank-summary", "processes-did-not-join"]),
}


def _now() -> float:
    return time.monotonic()


class Kit:
    def __init__(self, args: argparse.Namespace) -> None:
        self.out = Path(args.outdir).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.py = args.python or sys.executable
        self.device = args.device
        self.small = args.small
        self.install_mode = args.install
        self.jobs = max(1, args.jobs)
        self.only = set(filter(None, (args.only or "").split(",")))
        self.deadline = _now() + args.budget
        self.steps: list[dict[str, Any]] = []
        self.env: dict[str, str] = dict(os.environ)
        # no network, no telemetry, no colour in the files
        self.env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                         "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1",
                         "COLUMNS": "120", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
        self.env.pop("PYTHONPATH", None)
        self.installed_with = "none"
        self.facts: dict[str, Any] = {}

    # ---- running one step -------------------------------------------------------------------
    def remaining(self) -> float:
        return self.deadline - _now()

    def sh(self, name: str, cmd: list[str], timeout: float, *, log: str | None = None, env: dict | None = None,
           cwd: Path | None = None, keep: list[str] | None = None, what: str = "") -> dict[str, Any]:
        """Run `cmd` with a timeout, its output in OUTDIR/`log`; the record of the step."""
        rec: dict[str, Any] = {"step": name, "what": what, "command": " ".join(cmd), "files": []}
        budget = min(timeout, self.remaining())
        if budget < 5:
            rec.update(status="skipped", note="out of time (the kit's budget was spent)", seconds=0.0)
            return rec
        log_path = self.out / (log or f"{name}.log")
        start = _now()
        try:
            with open(log_path, "wb") as fh:
                p = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=budget, cwd=cwd or ROOT,
                                   env=env or self.env)
            rec.update(status="ok" if p.returncode == 0 else "failed", exit=p.returncode)
        except subprocess.TimeoutExpired:
            rec.update(status="timeout", note=f"killed after {budget:.0f} s")
        except OSError as exc:
            rec.update(status="failed", note=f"could not start: {exc}")
        rec["seconds"] = round(_now() - start, 1)
        rec["files"] = [log_path.name] + [k for k in keep or [] if (self.out / k).exists()]
        return rec

    def record(self, rec: dict[str, Any]) -> dict[str, Any]:
        self.steps.append(rec)
        said = f"exit {rec['exit']}" if "exit" in rec else rec["status"]
        print(f"[kit] {rec['step']:<28} {said:<8} {rec.get('seconds', 0):6.1f} s  {rec.get('note', '')}", flush=True)
        return rec

    def mpdoctor(self, *args: str) -> list[str]:
        return [self.py, "-m", "mpdoctor", *args]

    # ---- 1. env -----------------------------------------------------------------------------------
    def torch_identity(self) -> dict[str, Any]:
        code = ("import json, sys\n"
                "out = {'python': sys.version.split()[0], 'executable': sys.executable}\n"
                "try:\n"
                "    import torch\n"
                "    out.update(torch=torch.__version__, torch_file=torch.__file__, cuda=torch.version.cuda,\n"
                "               cuda_available=torch.cuda.is_available(), gpus=[torch.cuda.get_device_name(i)\n"
                "               for i in range(torch.cuda.device_count())])\n"
                "except Exception as exc:\n"
                "    out['torch_error'] = f'{type(exc).__name__}: {exc}'\n"
                "for name in ('accelerate', 'transformers', 'rich', 'psutil', 'yaml', 'packaging', 'pynvml',\n"
                "             'tomli'):\n"
                "    try:\n"
                "        m = __import__(name)\n"
                "        out.setdefault('modules', {})[name] = getattr(m, '__version__', 'present')\n"
                "    except Exception:\n"
                "        out.setdefault('modules', {})[name] = None\n"
                "print(json.dumps(out))\n")
        clean = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
        try:
            p = subprocess.run([self.py, "-c", code], capture_output=True, text=True, env=clean,
                               timeout=min(120, self.remaining()))
            return json.loads(p.stdout.strip().splitlines()[-1])
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    def step_env(self) -> None:
        start = _now()
        ident = self.torch_identity()
        self.facts["before"] = ident
        (self.out / "env.json").write_text(json.dumps(ident, indent=1))
        gpus = ident.get("gpus") or []
        if self.device == "auto":
            self.device = "cuda" if ident.get("cuda_available") else "cpu"
        self.facts["gpus"] = gpus
        status = "ok" if "torch" in ident else "failed"
        note = (f"Python {ident.get('python')}, torch {ident.get('torch')} (CUDA {ident.get('cuda')}), "
                f"{len(gpus)} GPU(s): {', '.join(dict.fromkeys(gpus)) or 'none'}; device {self.device}")
        self.record({"step": "env", "what": "the interpreter, torch, the GPUs", "status": status,
                     "seconds": round(_now() - start, 1), "files": ["env.json"], "note": note})

    # ---- 2. install -------------------------------------------------------------------------------
    def _wheels(self, names: tuple[str, ...]) -> list[str]:
        out = []
        for name in names:
            found = sorted(WHEELS.glob(f"{name}-*.whl"))
            if found:
                out.append(str(found[-1]))
        return out

    def step_install(self) -> None:
        mode = self.install_mode
        modules = (self.facts.get("before") or {}).get("modules") or {}
        py = tuple(int(x) for x in str((self.facts.get("before") or {}).get("python", "3.11")).split(".")[:2])
        extra = tuple(w for m, w in RUNTIME_IF_MISSING.items()
                      if not modules.get(m) and not (m == "tomli" and py >= (3, 11)))
        if mode in ("auto", "pip", "system"):
            site = self.out / "site"
            target = [] if mode == "system" else ["--target", str(site)]
            if site.exists():
                shutil.rmtree(site)
            cmd = [self.py, "-m", "pip", "install", "--no-deps", "--no-index", "--find-links", str(WHEELS),
                   "--no-warn-script-location", "--disable-pip-version-check", *target, str(ROOT),
                   *self._wheels(RUNTIME + extra)]
            rec = self.sh("install", cmd, 240, what="mpdoctor's core, torch untouched")
            if rec["status"] == "ok":
                if mode != "system":
                    self.env["PYTHONPATH"] = str(site)
                check = subprocess.run([self.py, "-c", "import mpdoctor, rich; print(mpdoctor.__file__)"],
                                       capture_output=True, text=True, env=self.env, cwd=self.out, timeout=60)
                where = check.stdout.strip()
                installed = str(site) in where if mode != "system" else not where.startswith(str(ROOT))
                if check.returncode == 0 and installed:
                    how = f"--target {site}" if mode != "system" else "into the interpreter"
                    self.installed_with = f"pip ({how})"
                    rec["note"] = f"{self.installed_with}: mpdoctor from {where}"
                    self.record(rec)
                    return
                rec.update(status="failed", note=f"installed, but mpdoctor imports from {where or check.stderr[-200:]}")
            self.record(rec)
            self.env.pop("PYTHONPATH", None)
            if mode != "auto":
                return
        # PYTHONPATH: the checkout and the pure wheels (zip imports)
        paths = [str(ROOT), *self._wheels(RUNTIME + extra)]
        self.env["PYTHONPATH"] = os.pathsep.join(paths)
        self.installed_with = "PYTHONPATH (the checkout and bench/gpu/wheels/*.whl)"
        start = _now()
        p = subprocess.run([self.py, "-c", "import mpdoctor, rich; print(mpdoctor.__file__)"], capture_output=True,
                           text=True, env=self.env, timeout=60)
        self.record({"step": "install (PYTHONPATH)", "what": "mpdoctor from the checkout, torch untouched",
                     "status": "ok" if p.returncode == 0 else "failed", "seconds": round(_now() - start, 1),
                     "files": [], "note": (p.stdout.strip() or p.stderr.strip()[-300:])})

    # ---- 3-5. the faces ---------------------------------------------------------------------------
    def plan(self) -> list[tuple[str, list[str], float, dict[str, Any]]]:
        """The independent steps: (name, command, timeout, options)."""
        dev = self.device
        small = self.small
        steps: list[tuple[str, list[str], float, dict[str, Any]]] = []
        steps.append(("collect", self.mpdoctor("collect", "-o", str(self.out / "collect.json")), 120,
                      {"keep": ["collect.json"], "what": "the environment as JSON"}))
        if not small:  # the dry run judges the snapshot instead (no second torch import)
            steps.append(("check", self.mpdoctor("check", "--format", "json"), 120,
                          {"log": "check.json", "what": "the environment judged (live)"}))
        modes = "bf16" if small else "no,fp16,bf16,fp8"
        probe = self.mpdoctor("probe", "--format", "json", "--device", dev, "--modes", modes,
                              "--steps", "3" if small else "12", "--timeout", "60" if small else "100")
        if small:
            probe += ["--model", "mlp"]
        steps.append(("probe", probe, 150 if small else 240,
                      {"log": "probe.json", "what": f"each precision mode live ({modes})"}))
        for script, (what, _) in RUNS.items():
            name = f"run-{script}"
            run_dir = self.out / name
            run_dir.mkdir(exist_ok=True)
            env = dict(self.env, MPDOCTOR_KIT_DEVICE=dev, MPDOCTOR_KIT_SMALL="1" if small else "0",
                       MPDOCTOR_KIT_OUT=str(run_dir))
            if script == "two_ranks" and self.wanted(name):
                if dev != "cuda" or len(self.facts.get("gpus") or []) < 2:
                    self.record({"step": name, "what": what, "status": "skipped", "seconds": 0.0, "files": [],
                                 "note": f"needs two GPUs ({len(self.facts.get('gpus') or [])} visible)"})
                    continue
                child = [self.py, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                         str(SCRIPTS / f"{script}.py")]
            else:
                child = [self.py, str(SCRIPTS / f"{script}.py")]
            report = f"{name}/report.json"
            steps.append((name, self.mpdoctor("run", "--report", str(self.out / report), "--", *child),
                          120 if small else 150, {"log": f"{name}/output.log", "keep": [report], "env": env,
                                                  "what": what, "cwd": SCRIPTS}))
        steps.append(("sync", [self.py, str(HERE / "sync_check.py"), str(self.out / "sync.json"), "--device", dev],
                      120, {"keep": ["sync.json"], "what": "host syncs inside a watched step"}))
        return steps

    def wanted(self, name: str) -> bool:
        return not self.only or name in self.only or (name.startswith("run-") and "run" in self.only)

    def run_independent(self) -> None:
        planned = [item for item in self.plan() if self.wanted(item[0])]

        def go(item: tuple) -> dict[str, Any]:
            name, cmd, timeout, opts = item
            return self.sh(name, cmd, timeout, log=opts.get("log"), env=opts.get("env"), keep=opts.get("keep"),
                           what=opts.get("what", ""), cwd=opts.get("cwd"))

        if self.jobs == 1:
            for item in planned:
                self.record(go(item))
            return
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            for rec in pool.map(go, planned):
                self.record(rec)

    def step_check_snapshot(self) -> None:
        """`check --snapshot` of what collect wrote: the snapshot judged without torch."""
        if not self.wanted("collect") or not (self.out / "collect.json").exists():
            return
        self.record(self.sh("check --snapshot", self.mpdoctor("check", "--snapshot", str(self.out / "collect.json"),
                                                             "--format", "json"), 60,
                            log="check-snapshot.json", what="collect's snapshot judged, without torch"))

    def step_bench(self) -> None:
        if not self.wanted("bench"):
            return
        cmd = [self.py, str(HERE / "step_bench.py"), str(self.out / "step-bench.json"), "--device", self.device]
        if self.small:
            cmd += ["--small", "--warmup", "1", "--steps", "2"]
        self.record(self.sh("bench", cmd, 150 if self.small else 200, keep=["step-bench.json"],
                            what="step time: mpdoctor vs detect_anomaly vs DebugUnderflowOverflow"))

    def step_torch_unchanged(self) -> None:
        if self.installed_with.startswith("PYTHONPATH") or self.installed_with == "none":
            return  # nothing was installed: nothing could have changed torch
        after = self.torch_identity()
        before = self.facts.get("before") or {}
        same = all(before.get(k) == after.get(k) for k in ("torch", "torch_file"))
        self.facts["after"] = after
        self.record({"step": "torch untouched", "what": "torch's version and file before and after",
                     "status": "ok" if same else "failed", "seconds": 0.0, "files": [],
                     "note": f"torch {after.get('torch')} at {after.get('torch_file')}" if same else
                     f"before {before.get('torch')} {before.get('torch_file')}, after {after.get('torch')} "
                     f"{after.get('torch_file')}"})

    # ---- the summary --------------------------------------------------------------------------------
    def judge_outputs(self) -> None:
        """Read what each step wrote; a step whose output does not parse has failed."""
        for rec in self.steps:
            try:
                self._judge(rec)
            except Exception as exc:
                rec["status"] = "failed"
                rec["note"] = (rec.get("note", "") + f" (output unreadable: {type(exc).__name__}: {exc})").strip()

    def _load(self, name: str) -> Any:
        return json.loads((self.out / name).read_text())

    def _judge(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        if rec["status"] in ("skipped", "timeout") or step in ("env", "torch untouched") or step.startswith("install"):
            return
        if step == "collect":
            snap = self._load("collect.json")
            rec["note"] = f"schema {snap.get('schema')}, torch {((snap.get('torch') or {}).get('version'))}"
        elif step in ("check", "check --snapshot"):
            data = self._load("check.json" if step == "check" else "check-snapshot.json")
            rec["status"] = "ok" if rec.get("exit") in (0, 1) else "failed"
            rec["note"] = self._counts(data.get("findings") or [])
        elif step == "probe":
            data = self._load("probe.json")
            rec["status"] = "ok" if rec.get("exit") in (0, 1) else "failed"
            self.facts["probe"] = data
            rec["note"] = ", ".join(f"{m['mode']}: {'ok' if m.get('ok') else 'failed'}" for m in data.get("modes", []))
        elif step.startswith("run-"):
            script = step[4:]
            data = self._load(f"{step}/report.json")
            rules = [f["rule"] for f in data.get("findings", [])]
            expected = RUNS[script][1]
            hit = [r for r in rules if r in expected]
            rec["status"] = "ok" if hit else "unexpected"
            rec["top"] = rules[:4]
            rec["note"] = (f"exit {rec.get('exit')}; found {hit[0]}" if hit else
                           f"exit {rec.get('exit')}; expected one of {', '.join(expected)}, "
                           f"found {', '.join(rules[:4]) or 'nothing'}")
            self.facts.setdefault("runs", {})[script] = data
        elif step == "sync":
            data = self._load("sync.json")
            rec["status"] = "ok" if data.get("ok") else "failed"
            cu = data.get("cuda_sync_warnings")
            rec["note"] = (f"extra host reads a step {data['python_reads']['extra']}" +
                           (f"; extra CUDA syncs a step {cu['extra']}" if cu else "; CUDA sync debug mode n/a"))
        elif step == "bench":
            data = self._load("step-bench.json")
            self.facts["bench"] = data
            rec["note"] = f"{data.get('model')}, {data.get('params'):,} parameters, {data.get('device_name')}"

    @staticmethod
    def _counts(findings: list[dict]) -> str:
        sev = [f.get("severity") for f in findings]
        return f"{sev.count('error')} error(s), {sev.count('warning')} warning(s), {sev.count('info')} note(s)"

    def summary(self) -> str:
        before = self.facts.get("before") or {}
        gpus = self.facts.get("gpus") or []
        lines = ["# mpdoctor GPU kit", "",
                 f"Machine: {', '.join(dict.fromkeys(gpus)) or 'no GPU'} ({len(gpus)} visible) · Python "
                 f"{before.get('python')} · torch {before.get('torch')} (CUDA {before.get('cuda')}) · device "
                 f"`{self.device}`{' · --small' if self.small else ''}",
                 f"mpdoctor installed with: {self.installed_with}", "",
                 "| step | status | time | what it shows | result | output |", "|---|---|---|---|---|---|"]
        for r in self.steps:
            files = ", ".join(f"`{f}`" for f in r.get("files", []))
            note = str(r.get("note", "")).replace("|", "\\|").replace("\n", " ")[:220]
            lines.append(f"| {r['step']} | {r['status']} | {r.get('seconds', 0):.1f} s | {r.get('what', '')} | "
                         f"{note} | {files} |")
        bench = self.facts.get("bench")
        if bench:
            lines += ["", f"## Instrumentation cost ({bench.get('model')}, {bench.get('params'):,} parameters, batch "
                          f"{bench.get('batch')} × seq {bench.get('seq')}, {bench.get('device_name')}, "
                          f"{bench.get('steps')} timed steps each, interleaved)", "",
                      "| precision | configuration | median step | ratio to bare | best step |",
                      "|---|---|---|---|---|"]
            for precision, rows in bench.get("precisions", {}).items():
                for name, row in rows.items():
                    lines.append(f"| {precision}{' + GradScaler' if precision == 'fp16' else ''} | {name} | "
                                 f"{row['median_ms']:.1f} ms | {row['ratio']:.2f}× | {row['best_ms']:.1f} ms |")
        probe = self.facts.get("probe")
        if probe:
            lines += ["", "## Probe", "", "| mode | trained | runs as | step | speed-up | peak memory | loss vs fp32 "
                      "| scaler skipped | note |", "|---|---|---|---|---|---|---|---|---|"]
            for m in probe.get("modes", []):
                mem = m.get("peak_memory_bytes")
                lines.append(
                    f"| {m.get('mode')} | {'yes' if m.get('ok') else 'no'} | {m.get('autocast_dtype') or '—'} | "
                    f"{(m.get('step_time_s') or 0) * 1000:.1f} ms | {m.get('speedup') or 0:.2f}× | "
                    f"{(mem or 0) / 2**20:.0f} MiB ({m.get('memory_kind', '')}) | {m.get('loss_rel_diff')} | "
                    f"{m.get('skipped_steps')} | {str(m.get('error') or m.get('reason') or '')[:120]} |")
        runs = self.facts.get("runs") or {}
        if runs:
            lines += ["", "## `mpdoctor run` on the GPU scripts", "", "| script | exit | findings (rule: title) |",
                      "|---|---|---|"]
            for script, data in runs.items():
                found = "; ".join(f"{f['rule']}: {f.get('title', '')}"[:140] for f in data.get("findings", [])[:3])
                lines.append(f"| {script} | {data.get('exit_code')} | {found.replace('|', '/')} |")
        bad = [r["step"] for r in self.steps if r["status"] not in ("ok", "skipped")]
        lines += ["", f"{len(self.steps)} steps: {len(self.steps) - len(bad)} ok or skipped"
                      + (f", not ok: {', '.join(bad)}" if bad else "") + "."]
        return "\n".join(lines) + "\n"

    def main(self) -> int:
        t0 = _now()
        for step in (self.step_env, self.step_install, self.run_independent, self.step_check_snapshot, self.step_bench,
                     self.step_torch_unchanged):
            try:
                step()
            except Exception as exc:  # a broken step is recorded, never the end of the kit
                self.record({"step": step.__name__.replace("step_", ""), "status": "failed", "seconds": 0.0,
                             "files": [], "note": f"kit error: {type(exc).__name__}: {exc}"})
        self.judge_outputs()
        text = self.summary()
        (self.out / "summary.md").write_text(text, encoding="utf-8")
        (self.out / "summary.json").write_text(json.dumps(
            {"schema": 1, "device": self.device, "small": self.small, "installed_with": self.installed_with,
             "seconds": round(_now() - t0, 1), "steps": self.steps, "env": self.facts.get("before")}, indent=1))
        print(text)
        print(f"[kit] {round(_now() - t0, 1)} s; everything is in {self.out}")
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/gpu/run.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", help="where every output and summary.md go (created)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="default: cuda when torch sees a GPU")
    ap.add_argument("--small", action="store_true", help="the dry run: a tiny decoder, few steps, bf16 probe only")
    ap.add_argument("--install", choices=("auto", "pip", "system", "pythonpath"), default="auto",
                    help="auto (default): pip --target OUTDIR/site, else PYTHONPATH; system: pip into the "
                         "interpreter (--no-deps: torch untouched)")
    ap.add_argument("--python", help="the interpreter that trains (default: the one running the kit)")
    ap.add_argument("--jobs", type=int, default=1, help="independent steps at once (default 1: clean timings)")
    ap.add_argument("--budget", type=float, default=450, help="seconds for the whole kit (default 450)")
    ap.add_argument("--only", help="comma-separated steps to run (env and install always run): collect, check, "
                                   "probe, run (every script) or run-SCRIPT, sync, bench")
    args = ap.parse_args(argv)
    return Kit(args).main()


if __name__ == "__main__":
    sys.exit(main())
