"""Where each rank is when a job hangs (inside a process of `mpdoctor run --job-dir`).

Three ways to a stack dump, each written to JOB_DIR/stacks/<host>-rank<N>.txt in
faulthandler's format (the most recent call first), main thread marked:
- a rank whose collective fails with a timeout or a lost peer asks every rank for its
  stack (a request file in the shared folder; each rank's daemon thread looks for it
  twice a second) and waits a moment for them before it goes on failing;
- `kill -USR1 PID` on any rank (faulthandler's own handler, all threads);
- the rank's uncaught exception itself, as its traceback.
With the request, each rank also writes torch's Flight Recorder record (when the process
group was initialised and TORCH_FR_BUFFER_SIZE is set) to JOB_DIR/flight/, where NCCL's
watchdog writes its own on a timeout; gloo has no watchdog dump, so this is gloo's.

Records only, never raises into the user's program, imports torch only when it is
already imported.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time

REQUEST = "dump-request"
WAIT_FOR_PEERS = 2.0  # seconds a failing rank waits for the others' stacks
POLL = 0.5
_STATE: dict = {}
_DISTRIBUTED_WORDS = ("Timed out", "timed out", "Timeout", "timeout", "Connection reset by peer",
                      "Connection closed by peer", "DistBackendError", "NCCL", "Broken pipe")


def install(job_dir: str | None = None) -> bool:
    """Arm the three ways for this process; False where it cannot (no job folder)."""
    try:
        job_dir = job_dir or os.environ.get("MPDOCTOR_JOB_DIR")
        if not job_dir or _STATE or not os.environ.get("RANK", "").isdigit():  # a launcher is no rank
            return False
        stacks = os.path.join(job_dir, "stacks")
        os.makedirs(stacks, exist_ok=True)
        rank = os.environ["RANK"]
        host = "".join(c if c.isalnum() or c in "-_." else "_" for c in (socket.gethostname() or "node"))[:64]
        _STATE.update(job_dir=job_dir, stacks=stacks, rank=rank, host=host, started=time.time(), seen=0.0,
                      path=os.path.join(stacks, f"{host}-rank{rank}.txt"), flight=os.path.join(job_dir, "flight"))
        if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
            fh = open(_STATE["path"], "a")  # kept open: the handler writes to its descriptor
            _STATE["file"] = fh
            faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True, chain=False)
        threading.Thread(target=_watch, name="mpdoctor-hang", daemon=True).start()
        previous = sys.excepthook

        def hook(tp, value, tb):  # the user's error printed first (the launcher may stop us any moment)
            try:
                previous(tp, value, tb)
            finally:
                try:
                    _on_error(value, tb)
                except Exception:
                    pass

        sys.excepthook = hook
        return True
    except Exception:
        return False


def _mark(fh, why: str) -> None:
    fh.write(f"# mpdoctor: rank {_STATE.get('rank')} main thread 0x{threading.main_thread().ident or 0:016x} "
             f"({why})\n")
    fh.flush()


def _request_path() -> str:
    return os.path.join(_STATE["stacks"], REQUEST)


def _watch() -> None:
    while True:
        time.sleep(POLL)
        try:
            st = os.stat(_request_path())
        except OSError:
            continue
        if st.st_mtime >= _STATE["started"] - 1 and st.st_mtime > _STATE["seen"] and not _STATE.get("failing"):
            _STATE["seen"] = st.st_mtime
            dump_now("a peer asked")


def dump_now(why: str) -> None:
    """Every thread's stack and the Flight Recorder's record, now."""
    try:
        with open(_STATE["path"], "a") as fh:
            _mark(fh, why)
            faulthandler.dump_traceback(file=fh, all_threads=True)
    except Exception:
        pass
    dump_flight()


def dump_flight() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not os.environ.get("TORCH_FR_BUFFER_SIZE", "0").strip("0"):
        return
    try:
        dist = torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            return
        from torch._C._distributed_c10d import _dump_fr_trace

        data = _dump_fr_trace(True, True, False)
        os.makedirs(_STATE["flight"], exist_ok=True)
        rank = _STATE.get("rank") or str(dist.get_rank())
        with open(os.path.join(_STATE["flight"], f"{_STATE['host']}-rank_{rank}"), "wb") as fh:
            fh.write(data)
    except Exception as exc:  # said in the stacks file: why this rank's record is missing
        try:
            with open(_STATE["path"], "a") as fh:
                fh.write(f"# mpdoctor: no Flight Recorder dump ({type(exc).__name__}: {str(exc)[:200]})\n")
        except Exception:
            pass


def _on_error(value: BaseException, tb) -> None:
    import traceback

    _STATE["failing"] = True
    frames = traceback.extract_tb(tb)
    try:
        with open(_STATE["path"], "a") as fh:
            _mark(fh, f"uncaught {type(value).__name__}")
            fh.write(f"Current thread 0x{threading.main_thread().ident or 0:016x} (most recent call first):\n")
            for f in reversed(frames):
                fh.write(f'  File "{f.filename}", line {f.lineno} in {f.name}\n')
    except Exception:
        pass
    text = str(value)
    if any(w in text for w in _DISTRIBUTED_WORDS) or type(value).__name__ == "DistBackendError":
        try:  # the others' stacks, while they are still where they wait
            with open(_request_path(), "a"):
                pass
            os.utime(_request_path())
        except OSError:
            pass
        dump_flight()
        time.sleep(WAIT_FOR_PEERS)
    else:
        dump_flight()
