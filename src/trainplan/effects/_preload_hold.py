"""The first module the launch's forkserver imports: Ctrl-C is ignored while it imports torch (`FORKSERVER_PRELOAD`).

The server shares the terminal's process group with the launcher, so a Ctrl-C during its seconds of importing
torch reached it too, and it printed a KeyboardInterrupt traceback before the launcher's one line. The launcher
answers the Ctrl-C itself (it stops the server with everything else); `_preload_release`, the last module imported,
gives SIGINT back its default before the server sets its own (and its workers inherit that)."""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
