"""The `trainplan` command's first code, outside the package so that it runs before anything of trainplan is
imported: Ctrl-C at any moment, even while trainplan (or, for `trainplan launch`, torch) is still being imported,
is one line and exit 130, never a KeyboardInterrupt traceback. The handler is set through the interpreter's
built-in `_signal` (`import signal` builds enums first: a Ctrl-C then printed a traceback from its import)."""

from __future__ import annotations

import _signal
import os
import sys


def _interrupted(number: int, frame: object) -> None:
    try:
        sys.stderr.write("trainplan: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + number)


def main() -> int:
    """The console script: `trainplan.cli.main`, imported under a handler that ends the command on Ctrl-C."""
    default = _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
    if default:  # an ignored SIGINT (a background job's) stays ignored
        _signal.signal(_signal.SIGINT, _interrupted)
    from trainplan.cli import main as run

    if default:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # from here on the CLI handles Ctrl-C itself
    return run()
