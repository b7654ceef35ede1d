"""The last module the launch's forkserver imports: Ctrl-C is Python's KeyboardInterrupt again (`_preload_hold`)."""

import signal

signal.signal(signal.SIGINT, signal.default_int_handler)
