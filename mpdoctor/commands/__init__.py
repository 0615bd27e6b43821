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

TYPE_CHECKING = False  # `typing` is not imported at run time: `explain` starts like a small script
if TYPE_CHECKING:
    import argparse
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

# The output formats every face that reports findings takes, and their options.
OUTPUT_FORMATS = ("terminal", "json", "markdown", "oneline")


def add_output_options(p: "argparse.ArgumentParser", formats: tuple[str, ...] = OUTPUT_FORMATS,
                       report_options: bool = True) -> None:
    """--format and --rules, which every face that reports findings takes; with
    `report_options`, also --anonymize and -v (faces whose output carries the user's
    paths and logs)."""
    helps = {"terminal": "terminal (default)", "json": "json (versioned, for scripts: docs/json-*.md)",
             "markdown": "markdown (for a GitHub issue)", "oneline": "oneline (one line per finding, for CI logs)"}
    p.add_argument("--format", choices=formats, default="terminal",
                   help=", ".join(helps[f] for f in formats))
    p.add_argument("--rules", action="append", default=[], metavar="DIR",
                   help="also load the rules in DIR (repeatable; MPDOCTOR_RULES_PATH works too)")
    if report_options:
        p.add_argument("--anonymize", action="store_true",
                       help="also hide the home directory (as ~), the user name and the host name; "
                            "secrets (tokens, passwords, URL credentials) are always redacted")
        p.add_argument("-v", "--verbose", action="store_true",
                       help="also show each finding's facts (the values its sentences were made from)")


EXIT_CODES = """\
exit status:
  0  no finding of severity error (also when the reader of the output went
     away, as in `mpdoctor check | head -1`)
  1  at least one error finding
  2  the input could not be read, or the arguments or rules are wrong
  130  interrupted (Ctrl-C)
"""

# Every MPDOCTOR_* variable a face reads, with what it does; each face's --help lists its own.
ENV_VARS: dict[str, str] = {
    "MPDOCTOR_RULES_PATH": "DIR[:DIR...]: also load these rule folders (like --rules)",
    "MPDOCTOR_CACHE_DIR": "where the compiled rule cache lives (default ~/.cache/mpdoctor)",
    "MPDOCTOR_NO_CACHE": "1: do not cache the compiled rules",
    "MPDOCTOR_NO_HYPERSCAN": "1: scan with Python's re even where Hyperscan is installed",
    "MPDOCTOR_PROGRESS_AFTER": "SECONDS: show reading progress on a terminal after this long (1.5)",
    "MPDOCTOR_TORCH_TIMEOUT": "SECONDS: how long the torch child may take to answer",
    "MPDOCTOR_NVML_TIMEOUT": "SECONDS: how long the NVML (driver) query may take to answer",
    "MPDOCTOR_WATCH_EVERY": "N: instrument every Nth step (1)",
    "MPDOCTOR_SAVE_EVENTS": "FILE: keep the wrapped run's recorded events (as fixtures are made)",
    "MPDOCTOR_JOB_DIR": "DIR: a folder shared by every node of a job (like run --job-dir)",
    "MPDOCTOR_SAVE_PROBE": "DIR: keep each probe mode's evidence (as fixtures are made)",
    "MPDOCTOR_INSTRUMENT_FAIL": "1: make the instrumentation fail on purpose (it must fail open)",
    "MPDOCTOR_PROBE_FAULT": "MODE:KIND[,...]: make a probe mode fail for real (testing)",
    "MPDOCTOR_PROBE_MEMORY_LIMIT": "SIZE: the memory --max-batch assumes (like --memory-limit)",
    "MPDOCTOR_DEBUG": "1: show mpdoctor's own traceback on an internal error",
    "NO_COLOR": "1: no colours (any value)",
}


def env_help(*names: str) -> str:
    """The `environment variables:` section of a face's --help epilog."""
    return "\nenvironment variables:\n" + "".join(f"  {n}\n      {ENV_VARS[n]}\n" for n in names)


def load(name: str) -> Any:
    return importlib.import_module(COMMANDS[name][0])


def fail(message: str) -> int:
    """One clear line on stderr, exit status 2 (bad input, arguments or rules); a
    message quoting the user's input (a path, a config line, a rule's words) carries no
    secret and no control character. Silent when stderr is closed (`2>&-`)."""
    from ..redact import scrub

    if sys.stderr is not None:
        try:
            sys.stderr.write(f"mpdoctor: {scrub(message)}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # full, or closed under us: the status still says it
            pass
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
    except OSError as exc:
        import errno

        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # `> /dev/full`, a full disk
            return fail(f"cannot write the output: {exc.strerror}")
        return internal_error(exc)
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
