# The interpreter's built-in signal module (what `signal` wraps in enums): the part `_trainplan_entry` uses.
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGINT: int

def default_int_handler(signalnum: int, frame: FrameType | None, /) -> None: ...
def getsignal(signalnum: int, /) -> Callable[[int, FrameType | None], Any] | int | None: ...
def signal(
    signalnum: int, handler: Callable[[int, FrameType | None], Any] | int, /
) -> Callable[[int, FrameType | None], Any] | int | None: ...
