"""`measure_model`: one training step measured under FakeTensorMode (no real memory), and its facts planned."""

from __future__ import annotations

import functools
import signal
import threading
import time
import warnings

import pytest
import torch

import trainplan as tp
from tests.llama_like import Decoder


def _small() -> Decoder:
    return Decoder(vocab=1000, hidden=128, layers=3, heads=4, ffn=344)


def test_a_small_decoder_is_measured_by_category() -> None:
    facts = tp.measure_model(_small, lambda: torch.randint(0, 1000, (2, 64)))
    count = sum(parameter.numel() for parameter in _small().parameters())
    assert facts.parameter_count == count
    assert facts.parameter_bytes == facts.gradient_bytes == 4 * count  # fp32 weights and gradients
    assert 8 * count <= facts.optimizer_bytes <= 8 * count + 1024  # AdamW: momentum and variance (+ step counters)
    assert facts.layer_count == 3 and facts.batch_size == 2
    assert facts.layer_input_bytes_per_sample == 64 * 128 * 4
    assert facts.hidden_size == 128  # a block's input width: what tensor parallelism must divide
    assert facts.activation_bytes_per_sample > facts.layer_count * facts.layer_input_bytes_per_sample


def test_measured_facts_plan_a_what_if() -> None:
    facts = tp.measure_model(_small, lambda: torch.randint(0, 1000, (2, 64)))
    env = tp.Environment(cuda_device_count=2, cuda_memory_bytes=(1 << 30, 1 << 30))
    assert tp.resolve(tp.Request(model=facts), env).strategy.name == "ddp"


def test_measured_facts_say_the_precision_their_step_ran_at() -> None:
    # no autocast in the measured step: fp32 parameters are 32-true's facts, bf16 ones bf16-true's
    assert tp.measure_model(_small, lambda: torch.randint(0, 1000, (2, 64))).precision == "32-true"
    bf16 = tp.measure_model(
        lambda: torch.nn.Sequential(*(torch.nn.Linear(64, 64, dtype=torch.bfloat16) for _ in range(3))),
        lambda: torch.randn(2, 64, dtype=torch.bfloat16),
    )
    assert (bf16.dtype, bf16.precision) == ("bfloat16", "bf16-true")
    env = tp.Environment(cuda_device_count=2, cuda_memory_bytes=(1 << 30, 1 << 30))
    with pytest.raises(tp.Incompatible, match="built for 'bf16-true'"):
        tp.resolve(tp.Request(model=bf16, precision="bf16-mixed"), env)


def test_a_module_that_cannot_run_is_not_measurable() -> None:
    def wrong_batch() -> torch.Tensor:
        return torch.randn(2, 3)  # floats where the embedding wants token ids

    try:
        tp.measure_model(_small, wrong_batch)
    except tp.NotMeasurable as error:
        assert "by hand" in str(error)
    else:
        raise AssertionError("a wrong batch was measured")


def test_the_root_unit_and_the_optimizer_steps_buffers_are_measured() -> None:
    facts = tp.measure_model(_small, lambda: torch.randint(0, 1000, (2, 64)))
    model = _small()
    outside = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in model.layers.parameters())
    assert facts.root_bytes == 4 * outside  # the embedding, the last norm and the head
    assert facts.largest_layer_bytes == 4 * sum(p.numel() for p in model.layers[0].parameters())
    assert facts.optimizer_step_bytes >= facts.parameter_bytes  # a foreach AdamW's intermediates


def test_a_llama_shaped_7b_is_measured_without_allocating_it() -> None:
    """6.7B parameters with AdamW hold 108 GB in one training step; measuring them must not hold even 2 GiB."""
    import resource

    from tests.llama_like import llama_7b

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    facts = tp.measure_model(llama_7b, lambda: torch.randint(0, 32000, (1, 512)))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert facts.parameter_count == 6_738_415_616 and facts.layer_count == 32
    assert facts.parameter_bytes + facts.gradient_bytes + facts.optimizer_bytes > 100 * 10**9
    assert grown < 2 << 30, f"measuring grew the process by {grown / 2**30:.1f} GiB"


def test_the_step_peak_tracker_measures_what_torchs_memtracker_does() -> None:
    """measure_model keeps only the step's peak (not each module's, which cost most of a 7B model's time): the facts
    are torch's MemTracker's, to the byte."""
    from unittest import mock

    from torch.distributed._tools.mem_tracker import MemTracker

    from trainplan.effects import measure

    assert type(measure._step_tracker()).__name__ == "StepPeakTracker"  # torch's internals are the ones relied on
    for checkpointing in (False, True):
        model = functools.partial(
            Decoder, vocab=1000, hidden=128, layers=3, heads=4, ffn=344, checkpointing=checkpointing
        )
        with mock.patch.object(measure, "_step_tracker", MemTracker):
            torchs = tp.measure_model(model, lambda: torch.randint(0, 1000, (2, 64)))
        assert tp.measure_model(model, lambda: torch.randint(0, 1000, (2, 64))) == torchs


def test_a_module_fake_tensors_cannot_run_leaves_stderr_quiet(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A shape mismatch made torch's fake_tensor logger print a 20-line traceback ("failed while attempting to run
    meta for aten.mm.default") before NotMeasurable; the error alone says it now."""
    with pytest.raises(tp.NotMeasurable, match=r"RuntimeError: a and b must have same reduction dim") as refused:
        tp.measure_model(lambda: torch.nn.Linear(8, 8), lambda: torch.randn(2, 3))
    assert capfd.readouterr().err == ""
    assert [record.getMessage() for record in caplog.records if record.name.startswith("torch")] == []
    assert "\n" not in str(refused.value)


class _WrongArgument(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add.Tensor(self.linear(inputs), "a")  # type: ignore[no-any-return]


def test_a_many_line_error_keeps_its_one_useful_line(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(tp.NotMeasurable) as refused:
        tp.measure_model(_WrongArgument, lambda: torch.randn(2, 8))
    assert "Expected a value of type 'Tensor' for argument 'other'" in str(refused.value)
    assert "\n" not in str(refused.value) and "Declaration" not in str(refused.value)
    assert capfd.readouterr().err == ""


class _Warns(torch.nn.Linear):
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        warnings.warn("the module's own warning", UserWarning, stacklevel=1)
        return super().forward(inputs)


def test_a_measured_modules_own_warnings_are_given_back() -> None:
    with pytest.warns(UserWarning, match="the module's own warning"):
        tp.measure_model(lambda: _Warns(8, 8), lambda: torch.randn(2, 8))


class _Sleeps(torch.nn.Linear):
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        time.sleep(60)
        return super().forward(inputs)


class _Loops(torch.nn.Linear):
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        while True:
            try:
                inputs = inputs + 1  # a module that swallows its own errors does not swallow the deadline
            except Exception:
                continue


@pytest.mark.parametrize("module", [_Sleeps, _Loops])
def test_measuring_past_its_timeout_is_not_measurable_naming_the_time(module: type[torch.nn.Linear]) -> None:
    handler, (left, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    with pytest.raises(tp.NotMeasurable, match=r"took longer than timeout=0\.2 s.*timeout=600\) or timeout=None"):
        tp.measure_model(lambda: module(8, 8), lambda: torch.randn(2, 8), timeout=0.2)
    # the caller's alarm (pytest-timeout's here) is put back as it was, less the time taken
    assert signal.getsignal(signal.SIGALRM) is handler
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == (left > 0)


def test_measuring_in_another_thread_is_bounded_too() -> None:
    caught: list[BaseException] = []

    def measure() -> None:
        try:
            tp.measure_model(lambda: _Loops(8, 8), lambda: torch.randn(2, 8), timeout=0.2)
        except BaseException as error:
            caught.append(error)

    worker = threading.Thread(target=measure)
    worker.start()
    worker.join(30)
    assert not worker.is_alive() and len(caught) == 1 and isinstance(caught[0], tp.NotMeasurable), caught


def test_a_measurement_within_its_timeout_leaves_no_alarm_behind() -> None:
    handler, (left, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    facts = tp.measure_model(lambda: torch.nn.Linear(8, 8), lambda: torch.randn(2, 8), timeout=30)
    assert facts.parameter_count == 72
    assert signal.getsignal(signal.SIGALRM) is handler
    now = signal.getitimer(signal.ITIMER_REAL)[0]
    assert now == 0 if left == 0 else left - 30 < now <= left  # the caller's timer, not the measurement's


@pytest.mark.parametrize("timeout", [0, -1, True, "60"])
def test_a_timeout_that_is_no_time_is_refused(timeout: object) -> None:
    with pytest.raises(tp.NotMeasurable, match=r"timeout=.*write the seconds measuring may take"):
        tp.measure_model(lambda: torch.nn.Linear(8, 8), lambda: torch.randn(2, 8), timeout=timeout)  # type: ignore[arg-type]


class _MlpBlock(torch.nn.Module):
    """A block holding a five-module Sequential of mixed classes: longer than the model's list of blocks."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.attention = torch.nn.Linear(hidden, hidden)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(hidden, 4 * hidden),
            torch.nn.GELU(),
            torch.nn.Linear(4 * hidden, hidden),
            torch.nn.Dropout(0.0),
            torch.nn.Identity(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.attention(x))  # type: ignore[no-any-return]


class _MlpModel(torch.nn.Module):
    def __init__(self, hidden: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(100, hidden)
        self.blocks = torch.nn.ModuleList(_MlpBlock(hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, 100)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # type: ignore[no-any-return]


def test_the_blocks_measured_are_the_ones_the_runtime_wraps() -> None:
    # the longest ModuleList/Sequential of any classes was each block's 5-module mlp: layer_count 5
    facts = tp.measure_model(_MlpModel, lambda: torch.randint(0, 100, (2, 16)))
    block = sum(parameter.numel() * 4 for parameter in _MlpBlock(64).parameters())
    assert len(tp.repeated_layers(_MlpModel())) == facts.layer_count == 4
    assert facts.largest_layer_bytes == block
    assert facts.root_bytes == (100 * 64 + 64 * 100 + 100) * 4


def test_blocks_names_the_blocks_as_rt_wrap_takes_it() -> None:
    facts = tp.measure_model(_MlpModel, lambda: torch.randint(0, 100, (2, 16)), blocks=torch.nn.Linear)
    assert facts.layer_count == 3 * 4 + 1  # the outermost Linear modules: each block's three, and the head
    with pytest.raises(tp.NotMeasurable, match="blocks= names the model's repeated blocks"):
        tp.measure_model(_MlpModel, lambda: torch.randint(0, 100, (2, 16)), blocks="blocks")  # type: ignore[arg-type]
