"""Entry point of a 'subprocess' launcher worker (started through a bootstrap that drops the working directory
from sys.path, then calls `main()` with the launcher's pid and RESULT_FD as its arguments).

Reads the caller's sys.path, then (spec, module, qualname, script, args, kwargs), pickled on stdin; imports `fn`
(running the script
as `__mp_main__`, as multiprocessing's spawn does, so its `if __name__ == "__main__":` block stays
quiet), runs it as a worker, and sends the outcome back through RESULT_FD.
"""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import sys
import traceback
from multiprocessing.connection import Connection
from types import ModuleType

from trainplan.effects.launching import _Outcome, _own_process_group, _send, run_worker
from trainplan.effects.lifeline import die_with_parent


def _load_script(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the script {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module  # so that objects pickled from the parent's __main__ resolve here
    spec.loader.exec_module(module)
    return module


def main() -> None:
    die_with_parent(int(sys.argv[-2]))  # the launcher that started this worker
    connection = Connection(int(sys.argv[-1]))
    _own_process_group()
    try:
        caller_path, body = pickle.loads(sys.stdin.buffer.read())
        sys.path[:] = [entry for entry in caller_path if isinstance(entry, str)]
        spec, module_name, qualname, script, args, kwargs = pickle.loads(body)
        module = _load_script(script) if script is not None else importlib.import_module(module_name)
        fn: object = module
        for part in qualname.split("."):
            fn = getattr(fn, part)
        if not callable(fn):
            raise TypeError(f"{module_name}.{qualname} is not callable")
    except BaseException:
        _send(connection, _Outcome("error", None, "The worker could not load the function:\n" + traceback.format_exc()))
        connection.close()
        raise SystemExit(1) from None
    _send(connection, run_worker(spec, fn, args, kwargs))
    connection.close()
    _exit_as_multiprocessing_does()


def _exit_as_multiprocessing_does() -> None:
    """End the worker as multiprocessing ends its own: wait for non-daemon threads, run the atexit handlers,
    flush, then `os._exit`. A full interpreter teardown after a DDP run sometimes aborts in torch's C++
    destructors ("terminate called without an active exception", SIGABRT) although the result was sent;
    multiprocessing's workers never tear down, and neither do these."""
    import atexit
    import contextlib
    import os
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if callable(shutdown):
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
