"""A `trainplan launch` worker forked from the launch's forkserver (torch preloaded there): the script run as
`python -u script.py` (or `python -u -m module`) would run it in a fresh interpreter.

The elastic engine's multiprocessing context calls `run_script` in each worker, after setting the worker's variables
and pointing its stdout and stderr at the rank's log files. This module imports nothing of trainplan but itself: a
worker unpickles it, and it must bring no launcher state along (the server is a fresh interpreter that imported
torch and nothing else; CUDA is never initialised there).
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Mapping


def run_script(
    program: str,
    module: bool,
    arguments: tuple[str, ...],
    environment: Mapping[str, str],
    server: Mapping[str, str],
) -> None:
    """Run `program` (a script path, or a module name when `module`) with `arguments` as this worker's `__main__`.

    `environment` is the launcher's at the launch (its common variables, the plan's, OMP_NUM_THREADS), `server` the
    one the forkserver started with: this worker was forked with the server's, and the engine set its own rank's
    variables over it; it takes the launch's, with the engine's (each a value the server did not have) over it."""
    ranks = {key: value for key, value in os.environ.items() if server.get(key) != value}
    os.environ.clear()
    os.environ.update(environment)
    os.environ.update(ranks)
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        # The server imported torch with its own environment: take the launch's OMP_NUM_THREADS, as a fresh
        # interpreter would have at its import of torch (torchrun's default: 1 for several workers per node).
        torch.set_num_threads(int(threads))
    with contextlib.suppress(OSError):
        # A session of its own, as the engine's subprocess workers have: the terminal's Ctrl-C reaches the launcher
        # only, and whatever the script leaves behind is found (and stopped) by its session and process group.
        os.setsid()
    for number in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT):
        if number is not None:
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
    _unbuffered()  # python -u, as torchrun runs a script: each line reaches the log file (and the console) at once
    sys.argv = [program, *arguments]
    # sys.path[0] as the interpreter sets it: the script's directory, or the working directory for -m.
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(program)))
    try:
        if module:
            runpy.run_module(program, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(program, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as error:
        # Shown on the rank's stderr, as the interpreter shows an uncaught exception (from the script's own frames
        # on, not this module's and runpy's); the engine then records it (its error file) and the worker exits 1.
        frames = error.__traceback__
        while frames is not None and frames.tb_next is not None and _ours(frames.tb_frame.f_code.co_filename):
            frames = frames.tb_next
        traceback.print_exception(type(error), error, frames)
        raise
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()


def _ours(filename: str) -> bool:
    """Whether a traceback frame is of this module or of runpy (which ran the script), not the script's."""
    return filename == __file__ or filename.endswith(("runpy.py", "<frozen runpy>"))


def _unbuffered() -> None:
    for name, number in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            old.flush()
            raw = open(number, "wb", buffering=0, closefd=False)  # noqa: SIM115 (the stream lives as long as the worker)
            encoding = getattr(old, "encoding", None) or "utf-8"
            errors = getattr(old, "errors", None) or "backslashreplace"
            setattr(sys, name, io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True))
