"""The user's code around a failure, read from the frames still alive and from the source
files: which frames are the user's, the variable that holds a tensor and the line that
assigned it, and what that line did (a cast, a creation, a module call). Used by
origin.py at a failure only."""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from typing import Any

import torch
from torch import Tensor

_MAX_FRAMES = 40
_LOOKBACK = 400  # source lines searched back for a variable's assignment
_CAST = re.compile(r"\.(?P<m>double|half|bfloat16|float)\(\s*\)|\.to\((?:[^()]*,\s*)?(?:dtype\s*=\s*)?"
                   r"torch\.(?P<d>float16|bfloat16|float64|double|half|float32|float)\b")
_CREATE = re.compile(r"\btorch\.(?:tensor|from_numpy|as_tensor|ones|zeros|full|arange|linspace|randn|rand|empty|"
                     r"eye|ones_like|zeros_like|full_like|empty_like)(?=\()")
_NUMPY = re.compile(r"\b(?:np|numpy)\.")
_LIB_DIRS = tuple({os.path.realpath(p) + os.sep for p in (sysconfig.get_paths().get("stdlib"),
                                                         sysconfig.get_paths().get("purelib"),
                                                         sysconfig.get_paths().get("platlib")) if p})
_OURS = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def user_file(filename: str) -> bool:
    """A file of the user's code: not the standard library, not an installed package, not mpdoctor."""
    if not filename or filename.startswith("<"):
        return filename.startswith("<ipython") or filename.startswith("<stdin")
    real = os.path.realpath(filename)
    if real.startswith(_OURS) or "site-packages" in real or "dist-packages" in real:
        return False
    return not any(real.startswith(d) for d in _LIB_DIRS)


def failure_frames(exc: BaseException | None, live: bool) -> list[Any]:
    """The frames of the failure, outermost first: the live stack (when called from a hook
    while the exception unwinds, the user's outer frames are only there) and the
    traceback's."""
    out: list[Any] = []
    if live:
        f = sys._getframe(1)
        stack = []
        while f is not None and len(stack) < _MAX_FRAMES:
            stack.append(f)
            f = f.f_back
        out.extend(reversed(stack))
    tb = exc.__traceback__ if exc is not None else None
    seen = {id(f) for f in out}
    while tb is not None:
        if id(tb.tb_frame) not in seen:
            out.append(tb.tb_frame)
            seen.add(id(tb.tb_frame))
        tb = tb.tb_next
    return out


def line_of(frame: Any, exc: BaseException | None) -> int:
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        if tb.tb_frame is frame:
            return tb.tb_lineno
        tb = tb.tb_next
    return frame.f_lineno


def file_line(filename: str, line: int) -> str:
    return f"{os.path.basename(filename)}:{line}"


# ---- which tensor is odd ---------------------------------------------------------------


def held_in(t: Tensor, frames: list[Any], exc: BaseException | None) -> tuple[Any, str, int, bool] | None:
    """Where the user's code holds `t` in a variable: (the frame whose source assigned it,
    the name, the line to search back from (0: the whole file), whether at the top level)."""
    for f in frames:  # outermost first: the variable the user named, not a parameter name
        if not user_file(f.f_code.co_filename):
            continue
        for var, obj in list(f.f_locals.items())[:400]:
            if obj is t and var != "self":
                top = f.f_locals is f.f_globals
                return f, var, line_of(f, exc), top
    for f in reversed(frames):
        if user_file(f.f_code.co_filename):
            for var, obj in list(f.f_globals.items())[:400]:
                if obj is t:
                    g = module_frame(f, frames)
                    return g, var, (line_of(g, exc) if g is not f else 0), True
    return None


def assigned_at(frame: Any, var: str, before: int, top: bool) -> tuple[int, str] | None:
    """The line that last assigned `var` before line `before` (0: the end of the file) of
    the frame's file, within its function (at the top level for a global searched in the
    whole file: column 0)."""
    fname = frame.f_code.co_filename
    first = 1 if top else frame.f_code.co_firstlineno
    pat = re.compile(rf"^(\s*)(?:[\w\[\].]+\s*,\s*)*{re.escape(var)}\s*(?::[^=]+)?(?:,\s*[\w\[\].]+\s*)*"
                     rf"(?:[+\-*/@]?=)(?!=)")
    last = before - 1 if before > 0 else len(linecache.getlines(fname))
    for line_no in range(last, max(first, last - _LOOKBACK) - 1, -1):
        text = linecache.getline(fname, line_no)
        m = pat.match(text)
        if m and (before > 0 or m.group(1) == ""):
            return line_no, without_comment(text.strip())
    return None


def without_comment(code: str) -> str:
    """A source line without its trailing `# comment` (a `#` inside a string stays)."""
    quote = None
    for i, ch in enumerate(code):
        if quote:
            if ch == quote and code[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return code[:i].rstrip()
    return code


def code_kind(code: str, var: str) -> tuple[str, str | None, str | None]:
    """("cast" | "created" | "computed", the cast spelled, the torch call that created it)."""
    rhs = code.split("=", 1)[1] if "=" in code else code
    m = _CAST.search(rhs)
    if m:
        return "cast", m.group(0), None
    m = _CREATE.search(rhs)
    if m:
        return "created", None, m.group(0)
    if _NUMPY.search(rhs):
        return "created", None, None
    return "computed", None, None


_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")


def called_module(code: str, frame: Any) -> tuple[str, Any] | None:
    """The first name called on the right of `code` that is a module in `frame` (`self.x` too)."""
    rhs = code.split("=", 1)[1] if "=" in code else code
    for dotted in _CALL.findall(rhs):
        head, *rest = dotted.split(".")
        obj = frame.f_locals.get(head, frame.f_globals.get(head))
        for attr in rest:
            obj = getattr(obj, attr, None) if isinstance(obj, torch.nn.Module) else None
        if isinstance(obj, torch.nn.Module):
            return dotted, obj
    return None


def module_frame(f: Any, frames: list[Any]) -> Any:
    """The module-level frame of `f`'s file, when it is on the stack (a global assigned there)."""
    for g in frames:
        if g.f_code.co_name == "<module>" and g.f_code.co_filename == f.f_code.co_filename:
            return g
    return f


def source_of(fn: Any) -> str | None:
    """file:line of a function's `def` (past its decorators)."""
    try:
        code = fn.__code__
        line = code.co_firstlineno
        for n in range(line, line + 8):
            if linecache.getline(code.co_filename, n).lstrip().startswith(("def ", "async def ")):
                line = n
                break
        return file_line(code.co_filename, line)
    except Exception:
        return None


# ---- the entry points ------------------------------------------------------------------
