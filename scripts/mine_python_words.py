"""Mine the words Python and the OS say in ordinary errors, whatever library raised them.

    python scripts/mine_python_words.py > mpdoctor/knowledge/tables/python-words.txt

The near-match fallback (mpdoctor/engine/likely.py) must not take "got an unexpected keyword
argument" for accelerate's removed kwarg, or "Too many open files" for a CUDA library: such
words are the language's, not a library's. They come from three sources, each read live from
this interpreter, never from a paste:
- the messages of CPython's built-in errors, raised here by small snippets;
- every errno's text (os.strerror) and every signal's name;
- the string literals of `raise ...(...)` in the standard library's modules.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import sys
import sysconfig
from pathlib import Path

WORD = re.compile(r"[a-z][a-z0-9_]{2,40}")

SNIPPETS = [
    "f = lambda a: a\nf(b=1)",  # unexpected keyword argument
    "f = lambda a: a\nf()",  # missing required positional argument
    "f = lambda a: a\nf(1, 2)",  # takes 1 positional argument but 2 were given
    "object().missing",  # has no attribute
    "import no_such_module_here",  # No module named
    "from os import no_such_name",  # cannot import name
    "[][1]",  # list index out of range
    "{}['k']",
    "1/0",
    "int('x')",  # invalid literal for int() with base 10
    "None()",  # not callable
    "None[0]",  # not subscriptable
    "1 + 'a'",  # unsupported operand type(s)
    "1 < 'a'",  # not supported between instances
    "len(1)",  # has no len()
    "iter(1)",  # not iterable
    "a, b = [1]",  # not enough values to unpack
    "a, = [1, 2]",  # too many values to unpack
    "def f(): f()\nf()",  # maximum recursion depth exceeded
    "open('/no/such/file')",
    "open('/')",  # Is a directory
    "import json; json.loads('{')",
    "'a'.encode('ascii'); 'é'.encode('ascii')",
    "b'\\xff'.decode('utf-8')",
    "float('x')",
    "dict(a=1)['b']",
    "assert False, 'assertion failed'",
    "raise NotImplementedError",
    "import subprocess; subprocess.run(['false'], check=True)",
    "import subprocess; subprocess.run(['/no/such/cmd'])",
    "x = {}; x.update(1)",
    "import pickle; pickle.dumps(lambda: 0)",
    "'{}'.format()",
    "tuple()[0]",
    "import argparse; p = argparse.ArgumentParser(); p.exit = None; p.parse_args(['--x'])",
    "import os; os.environ['NO_SUCH_VARIABLE_HERE']",
    "import os; os.kill(2**22, 0)",
    "import os; os.rmdir('/')",
]


def builtin_messages() -> list[str]:
    out = []
    for code in SNIPPETS:
        try:
            exec(compile(code, "<snippet>", "exec"), {})
        except SystemExit:
            continue
        except BaseException as exc:  # noqa: BLE001 - every message is the point
            out.append(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
    return out


def os_messages() -> list[str]:
    out = [os.strerror(i) for i in range(1, 134)]
    out += [s.name for s in signal.Signals]
    return out


def stdlib_messages() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in root.glob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                for arg in node.exc.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        out.append(arg.value)
                    elif isinstance(arg, ast.JoinedStr):
                        out.extend(v.value for v in arg.values if isinstance(v, ast.Constant))
    return out


def main() -> None:
    tiers: dict[str, int] = {}
    # tier 0: what the interpreter and the OS say themselves; tier 1: the standard library
    for tier, texts in ((0, builtin_messages() + os_messages()), (1, stdlib_messages())):
        for text in texts:
            for w in WORD.findall(text.lower()):
                tiers.setdefault(w, tier)
    print("# The words of Python's and the OS's own error messages (scripts/mine_python_words.py,")
    print(f"# CPython {sys.version.split()[0]}): not distinctive of any library's cause. A word and its tier:")
    print("# 0 said by the interpreter or the OS itself (no weight), 1 by the standard library (less weight).")
    for w in sorted(tiers):
        print(w, tiers[w])


if __name__ == "__main__":
    main()
