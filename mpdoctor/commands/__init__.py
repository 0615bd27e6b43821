"""The faces of mpdoctor, one module each (pip's command registry is the model).

Each module under this package defines:

    SUMMARY      one line for `mpdoctor --help`
    add_arguments(parser)   its options (the parser carries DESCRIPTION / EPILOG)
    main(args) -> int       a few lines over the core; the exit status

`cli.py` imports only the module of the command being run, so `mpdoctor explain`
pays for its own parser and nothing else. Every face runs under the one crash guard
here (`guarded`): mpdoctor never prints a traceback of its own.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

EXIT_OK, EXIT_ERROR_FINDING, EXIT_BAD_INPUT = 0, 1, 2

# name -> (module, one-line summary). The summary is here, not in the module, so that
# `mpdoctor --help` lists every face without importing any.
COMMANDS: dict[str, tuple[str, str]] = {
    "explain": ("mpdoctor.commands.explain", "explain a traceback or a training log"),
    "check": ("mpdoctor.commands.check", "judge this machine (or a snapshot) before training"),
    "collect": ("mpdoctor.commands.collect", "save this machine's environment as a snapshot"),
    "run": ("mpdoctor.commands.run", "wrap a training command and diagnose it as it fails"),
    "probe": ("mpdoctor.commands.probe", "measure every precision mode on this machine"),
    "rules": ("mpdoctor.commands.rules", "list, show and test the rule base"),
}

EXIT_CODES = """\
exit status:
  0  no finding of severity error
  1  at least one error finding
  2  the input could not be read, or the arguments or rules are wrong
"""


def load(name: str) -> Any:
    return importlib.import_module(COMMANDS[name][0])


def fail(message: str) -> int:
    """One clear line on stderr, exit status 2 (bad input, arguments or rules)."""
    sys.stderr.write(f"mpdoctor: {message}\n")
    return EXIT_BAD_INPUT


def load_rules_or_fail(extra: list[str]) -> Any:
    """The rule base, or the exit status 2 after saying which rule file is wrong."""
    from ..engine.rule import RuleError
    from ..rulebase import load

    try:
        return load(extra)
    except RuleError as exc:
        return fail(f"bad rule: {exc}")


def internal_error(exc: BaseException) -> int:
    """Last resort: one clear line instead of mpdoctor's own traceback."""
    if os.environ.get("MPDOCTOR_DEBUG") == "1":
        raise exc
    return fail(f"internal error ({type(exc).__name__}: {exc}); rerun with MPDOCTOR_DEBUG=1 "
                "to see where, and please report it")


def guarded(main: Callable[[Any], int], args: Any) -> int:
    """The one crash guard every face runs under."""
    try:
        return main(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`mpdoctor check | head -1`): not an error finding
        _quiet_stdout()
        return EXIT_OK
    except MemoryError:
        return fail("not enough memory for this input")
    except RecursionError as exc:
        return internal_error(exc)
    except Exception as exc:  # never a traceback of mpdoctor itself
        return internal_error(exc)


def _quiet_stdout() -> None:
    # Python flushes stdout at exit and would complain about the broken pipe again.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
