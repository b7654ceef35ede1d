"""Measuring a model's training step without a GPU and without its memory: `measure_model` builds the module under
torch's FakeTensorMode (tensors with shapes and dtypes, no storage), runs one forward, backward and optimizer step
under torch's `MemTracker`, and returns the `ModelFacts` the memory-aware choice reads."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from trainplan.effects.extras import require_torch
from trainplan.rules.memory import MEASURED_PRECISION
from trainplan.spec.errors import TrainplanError
from trainplan.spec.memory import ModelFacts
from trainplan.spec.names import HOST_DEVICE

if TYPE_CHECKING:
    import torch

    from trainplan.effects.runtime import Blocks


class NotMeasurable(TrainplanError, RuntimeError):
    """A module whose training step cannot run under FakeTensorMode (data-dependent control flow, a C extension
    that reads storage, a wrong batch): the facts can still be written by hand."""


MEASURE_TIMEOUT: Final = 120.0
"""How long `measure_model` may take unless told (seconds): six times a Llama-shaped 7B's measurement at sequence
4096 on two busy cores."""


class _OutOfTime(BaseException):
    """Raised into the measuring thread at its deadline; a BaseException, so that a module's `except Exception`
    does not swallow it."""


@functools.cache
def _warmed(device: str) -> bool:
    """One tiny step measured without a deadline, once a process and device, before any measurement with one: what
    torch imports on a first measured step (sympy through the MemTracker, the profiler's monitors through the
    optimizer) is then imported whole. An import cut off half-way by a deadline leaves a package without its
    submodules for the rest of the process (`module 'sympy' has no attribute 'core'`)."""
    import torch

    measure_model(lambda: torch.nn.Linear(2, 2), lambda: torch.ones(1, 2), device=device, timeout=None)
    return True


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise `_OutOfTime` in this thread after `seconds`: by SIGALRM in the main thread unless a timer of the
    caller's would ring first (it interrupts a sleep too), else from a timer thread between two bytecodes of this
    one (a sleep in C ends first)."""
    if seconds is None:
        yield
        return
    caller = signal.getitimer(signal.ITIMER_REAL) if hasattr(signal, "setitimer") else None
    main = threading.current_thread() is threading.main_thread()
    if main and caller is not None and (caller[0] == 0 or caller[0] > seconds):
        # the caller's own timer (pytest-timeout's, an alarm) is put back with what was left of it
        started = time.monotonic()

        def ring(signum: int, frame: object) -> None:
            raise _OutOfTime

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if caller[0] > 0:
                signal.setitimer(signal.ITIMER_REAL, max(caller[0] - (time.monotonic() - started), 1e-3), caller[1])
        return
    ident, lock, done = threading.get_ident(), threading.Lock(), [False]

    def interrupt() -> None:
        with lock:
            if not done[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_OutOfTime))

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            done[0] = True
            timer.cancel()
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)  # one raised too late: dropped


def measure_model(
    module_factory: Callable[[], torch.nn.Module],
    batch: Callable[[], Sequence[torch.Tensor] | torch.Tensor],
    *,
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
    device: str = HOST_DEVICE,
    timeout: float | None = MEASURE_TIMEOUT,
    blocks: Blocks | None = None,
) -> ModelFacts:
    """The facts of one training step of `module_factory()` on `batch()` (built under FakeTensorMode: write the
    factories so they create their tensors inside, e.g. `lambda: torch.randint(0, 32000, (1, 4096))`).

    `optimizer` (default AdamW) builds the optimizer from the parameters; `loss` reduces the output to a scalar
    (default: its sum). Nothing is allocated and no GPU is used; `device` is the fake device the tensors sit on.
    Measuring stops after `timeout` seconds (None: never), a Llama-shaped 7B taking about 20 s on two busy cores.
    The repeated blocks (a transformer's layers, counted and sized for checkpointing and sharding) are the ones
    `rt.wrap` finds, by the same rule: `tp.repeated_layers`, or `blocks=` (a class, a tuple of classes, or a
    function module -> bool) where it finds the wrong ones.
    Raises `NotMeasurable` when the step cannot run under FakeTensorMode or runs past `timeout`."""
    require_torch("trainplan.measure_model")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    seconds: object = timeout  # read as an object: a caller without a type checker may pass anything
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0):
        raise NotMeasurable(f"timeout={timeout!r}: write the seconds measuring may take, e.g. timeout=600, or None")
    if timeout is not None:
        _warmed(device)
    try:
        with _deadline(timeout), _quiet() as heard, FakeTensorMode(), torch.device(device):
            model = module_factory()
            inputs = batch()
            arguments = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
            step = (optimizer or (lambda parameters: torch.optim.AdamW(parameters, foreach=True)))(model.parameters())
            layers = _repeated_layers(model, blocks)
            layer_input: list[tuple[int, int]] = []
            handle = (
                layers[0].register_forward_pre_hook(
                    lambda module, args: layer_input.append((_bytes(args), _width(args))) if not layer_input else None
                )
                if layers
                else None
            )
            tracker = _step_tracker()
            tracker.track_external(model, step)
            with tracker:
                output = model(*arguments)
                activations = _category(tracker.get_tracker_snapshot("current"), "ACT")
                (loss or _sum)(output).backward()  # type: ignore[no-untyped-call]
                step.step()
                after = tracker.get_tracker_snapshot("current")
                peak = tracker.get_tracker_snapshot("peak")
            if handle is not None:
                handle.remove()
    except TrainplanError:
        raise
    except _OutOfTime:
        raise NotMeasurable(
            f"measuring the training step took longer than timeout={timeout:g} s (a module whose forward loops or "
            f"waits?). Give it longer with measure_model(..., timeout={max(4 * (timeout or 0), 600):g}) or "
            "timeout=None, or write the model's facts by hand (trainplan.ModelFacts or trainplan.transformer_facts)"
        ) from None
    except Exception as error:  # any failure of the user's module under fake tensors
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise NotMeasurable(
            f"the training step could not run under FakeTensorMode ({type(error).__name__}: {first}). Write the "
            "model's facts by hand (trainplan.ModelFacts or trainplan.transformer_facts)"
        ) from error
    for warning in heard:  # measured: what the module itself warned of is the user's to see
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    samples = int(arguments[0].shape[0]) if arguments and arguments[0].dim() else 1
    parameters = list(model.parameters())
    dtype = str(parameters[0].dtype).removeprefix("torch.") if parameters else "float32"
    largest = max((_module_bytes(layer) for layer in layers), default=_module_bytes(model))
    in_layers = sum(_module_bytes(layer) for layer in layers)
    return ModelFacts(
        parameter_count=sum(parameter.numel() for parameter in parameters),
        parameter_bytes=_category(after, "PARAM") + _category(after, "BUFFER"),
        gradient_bytes=_category(after, "GRAD"),
        optimizer_bytes=_category(after, "OPT"),
        activation_bytes_per_sample=-(-activations // samples),
        layer_count=max(len(layers), 1),
        layer_input_bytes_per_sample=-(-(layer_input[0][0] if layer_input else 0) // samples),
        largest_layer_bytes=largest,
        root_bytes=_module_bytes(model) - in_layers if layers else 0,
        temporary_bytes=_category(peak, "TEMP"),
        # the step's own buffers: the optimizer's peak over the states it keeps
        optimizer_step_bytes=max(_category(peak, "OPT") - _category(after, "OPT"), 0),
        batch_size=samples,
        hidden_size=layer_input[0][1] if layer_input else 0,
        dtype=dtype,
        precision=MEASURED_PRECISION.get(dtype),
    )


FAKE_TENSOR_LOGGERS: Final = ("torch._subclasses.fake_tensor",)
"""The loggers that print a traceback to stderr when a fake kernel fails ("failed while attempting to run meta for
aten.mm.default", "fake tensor raised TypeError"), before the error that `NotMeasurable` reports anyway."""


@contextlib.contextmanager
def _quiet() -> Iterator[list[warnings.WarningMessage]]:
    """Measuring without torch's noise on stderr: the fake-tensor loggers' tracebacks dropped and the warnings held
    (FakeTensor's data-pointer deprecation...), to be given back only when the step was measured."""
    loggers = [logging.getLogger(name) for name in FAKE_TENSOR_LOGGERS]
    disabled = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            yield heard
    finally:
        for logger, was in zip(loggers, disabled, strict=True):
            logger.disabled = was


def _step_tracker() -> Any:
    """A `MemTracker` that keeps only the step's peak per device: torch's also keeps each module's peak, walking
    every module it has seen and copying a snapshot on every operator (most of measuring a 7B model's time). Where
    torch's internals are not the ones this relies on (another torch), torch's own tracker."""
    from torch.distributed._tools import mem_tracker

    total = getattr(mem_tracker, "_TOTAL_KEY", None)
    base = mem_tracker.MemTracker

    class StepPeakTracker(base):  # type: ignore[misc, valid-type]
        def _update_peak_stats(self, peak_state: object) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot[total]:
                    self._peak_mem[device] = snapshot[total]
                    self._peak_mem_snap[device] = dict(snapshot)  # its values are ints: a copy of the one level

    tracker = StepPeakTracker()
    relied_on = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap")
    known = isinstance(total, str) and callable(getattr(base, "_update_peak_stats", None))
    return tracker if known and all(isinstance(getattr(tracker, name, None), dict) for name in relied_on) else base()


def _sum(output: Any) -> torch.Tensor:
    import torch

    if isinstance(output, torch.Tensor):
        return output.float().sum()
    raise NotMeasurable(f"the module returned {type(output).__name__}: pass loss= to reduce it to a tensor")


def _category(snapshot: dict[Any, dict[Any, int]], name: str) -> int:
    """One category's bytes over every device of a MemTracker snapshot (its keys are `_MemRefType` members)."""
    return sum(
        count for device in snapshot.values() for kind, count in device.items() if getattr(kind, "name", kind) == name
    )


def _bytes(arguments: object) -> int:
    import torch

    items = arguments if isinstance(arguments, tuple) else (arguments,)
    return sum(item.numel() * item.element_size() for item in items if isinstance(item, torch.Tensor))


def _width(arguments: object) -> int:
    """The last dimension of a block's first tensor input (a transformer's hidden size); 0 without one."""
    import torch

    items = arguments if isinstance(arguments, tuple) else (arguments,)
    first = next((item for item in items if isinstance(item, torch.Tensor) and item.dim()), None)
    return 0 if first is None else int(first.shape[-1])


def _module_bytes(module: torch.nn.Module) -> int:
    return sum(parameter.numel() * parameter.element_size() for parameter in module.parameters())


def _repeated_layers(model: torch.nn.Module, blocks: Blocks | None) -> list[torch.nn.Module]:
    """The model's repeated blocks as the runtime finds them (`find_blocks`: one definition, so the facts count the
    blocks `rt.wrap` checkpoints and shards); none when it finds none."""
    from trainplan.effects.runtime import NotWrappable, find_blocks

    try:
        return list(find_blocks(model, blocks).values())
    except NotWrappable as error:
        raise NotMeasurable(str(error)) from None


__all__ = ["NotMeasurable", "measure_model"]
