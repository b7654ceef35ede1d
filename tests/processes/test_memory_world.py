"""Prediction against measurement: a 21M-parameter decoder's training step, its peak per rank measured by torch's
MemTracker on real tensors in real gloo worlds (2 processes: DDP, FSDP2, FSDP2 with activation checkpointing;
4 processes: tensor parallel 2 × FSDP2 over 2, without and with checkpointing) and in one process, against what
`resolve.memory.estimate` predicts from the facts `measure_model` gives (measured once, on one device)."""

from __future__ import annotations

import functools

import pytest
import torch

import trainplan as tp
from tests.llama_like import small
from tests.scripts import memory_world
from trainplan.resolve.memory import estimate
from trainplan.rules.memory import MEMORY_LAYOUTS

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]  # real steps of a 21M model: slow on a busy host

LAYOUTS = {layout.name: layout for layout in MEMORY_LAYOUTS}
TOLERANCE = 0.15
"""The issue's bar: the predicted peak within ±15% of the measured one."""


@functools.cache
def _facts() -> tp.ModelFacts:
    return tp.measure_model(small, lambda: torch.randint(0, 8000, memory_world.BATCH))


def _predicted(layout: str, checkpointing: bool, world: int) -> int:
    return estimate(LAYOUTS[layout], checkpointing, _facts(), 1, world).total


def test_one_process_with_and_without_checkpointing_is_predicted_within_15_percent() -> None:
    for checkpointing in (False, True):
        measured = memory_world.peak("single_device", checkpointing)["Total"]
        ratio = _predicted("single_device", checkpointing, 1) / measured
        assert abs(ratio - 1) <= TOLERANCE, (checkpointing, ratio)
        print(f"single_device{' +ckpt' if checkpointing else ''}: predicted / measured = {ratio:.3f}")


def test_ddp_and_fsdp2_in_two_processes_are_predicted_within_15_percent() -> None:
    configurations = [("ddp", False), ("fsdp", False), ("fsdp", True)]
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=2, strategy="ddp"))
    measured = tp.launch_with(plan, memory_world.peaks, args=(configurations,), timeout=600)
    assert measured[0] == measured[1]  # both ranks hold the same shares
    facts = _facts()
    for (layout, checkpointing), peak in zip(configurations, measured[0], strict=True):
        ratio = estimate(LAYOUTS[layout], checkpointing, facts, 1, 2).total / peak
        assert abs(ratio - 1) <= TOLERANCE, (layout, checkpointing, ratio)
        print(f"{layout}{' +ckpt' if checkpointing else ''}: predicted / measured = {ratio:.3f}")


def test_tensor_parallel_2_by_fsdp2_over_2_in_four_processes_is_predicted_within_15_percent() -> None:
    configurations = [("tp2_fsdp", False), ("tp2_fsdp", True)]
    plan = tp.resolve(tp.Request(accelerator="cpu", devices=4, strategy="ddp"))
    measured = tp.launch_with(plan, memory_world.peaks, args=(configurations,), timeout=600)
    # Every rank holds one shard of each kind: the same peak up to the transient buffers a loaded machine's timing
    # moves (equal bytes on an idle machine; CI once saw the ranks differ), and each rank within the band.
    for index, (layout, checkpointing) in enumerate(configurations):
        peaks = [rank[index] for rank in measured]
        assert max(peaks) <= 1.05 * min(peaks), (layout, checkpointing, peaks)
        ratios = [_predicted(layout, checkpointing, 4) / peak for peak in peaks]
        assert all(abs(ratio - 1) <= TOLERANCE for ratio in ratios), (layout, checkpointing, ratios)
        print(f"{layout}{' +ckpt' if checkpointing else ''}: predicted / measured = {ratios[0]:.3f}")
