"""Memory: the predicted peak per rank against the one torch's MemTracker measures on real tensors in real gloo
worlds (the workloads of tests/processes/test_memory_world.py: a 21M-parameter decoder, 1, 2 and 4 processes), and
the time `measure_model` takes for a Llama-shaped 6.7B at 4096 tokens, next to the same step under torch's own
MemTracker (which also keeps every module's peak)."""

from __future__ import annotations

import contextlib
import time
import warnings
from unittest import mock

import torch
from tests import llama_like
from tests.scripts import memory_world

import trainplan as tp
from benchmarks.common import Row, human
from trainplan.effects import measure
from trainplan.resolve.memory import estimate
from trainplan.rules.memory import MEMORY_LAYOUTS

LAYOUTS = {layout.name: layout for layout in MEMORY_LAYOUTS}
WORLDS: dict[int, list[tuple[str, bool]]] = {
    1: [("single_device", False), ("single_device", True)],
    2: [("ddp", False), ("fsdp", False), ("fsdp", True)],
    4: [("tp2_fsdp", False), ("tp2_fsdp", True)],
}
"""Processes: the (layout, activation checkpointing) measured in one world of that many."""
SEVEN_B_TOKENS = (1, 4096)


def measured_peaks() -> list[tuple[str, int, int, int]]:
    """(layout, processes, predicted, measured) for each configuration, rank 0's peak (every rank's is the same)."""
    facts = tp.measure_model(llama_like.small, lambda: torch.randint(0, 8000, memory_world.BATCH))
    results = []
    for processes, configurations in WORLDS.items():
        if processes == 1:
            peaks = [memory_world.peak(layout, checkpointing)["Total"] for layout, checkpointing in configurations]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # cpu-oversubscribed: 4 processes on a 2-core machine
                plan = tp.resolve(tp.Request(accelerator="cpu", devices=processes, strategy="ddp"))
                peaks = tp.launch_with(plan, memory_world.peaks, args=(configurations,), timeout=900)[0]
        for (layout, checkpointing), peak in zip(configurations, peaks, strict=True):
            predicted = estimate(LAYOUTS[layout], checkpointing, facts, 1, processes).total
            results.append((f"{layout}{' + ckpt' if checkpointing else ''}", processes, predicted, peak))
    return results


def measure_seconds(torch_tracker: bool) -> float:
    """One `measure_model` of the Llama-shaped 6.7B at 4096 tokens (with torch's MemTracker in place of ours)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    start = time.perf_counter()
    with mock.patch.object(measure, "_step_tracker", MemTracker) if torch_tracker else contextlib.nullcontext():
        tp.measure_model(llama_like.llama_7b, lambda: torch.randint(0, 32000, SEVEN_B_TOKENS))
    return time.perf_counter() - start


def run() -> list[Row]:
    rows = []
    for name, processes, predicted, peak in measured_peaks():
        rows.append(
            Row(
                measure=f"peak per rank, {name}, {processes} gloo process(es)",
                ours=f"{predicted / 2**20:.1f} MiB predicted",
                theirs=f"{peak / 2**20:.1f} MiB",
                anchor="torch's MemTracker, real tensors",
                ratio=peak / predicted,
                target="within ±15%",
            )
        )
    ours, torchs = measure_seconds(torch_tracker=False), measure_seconds(torch_tracker=True)
    rows.append(
        Row(
            measure="measure_model, Llama-shaped 6.7B, 4096 tokens",
            ours=human(ours),
            theirs=human(torchs),
            anchor="the same step under torch's MemTracker",
            ratio=torchs / ours,
            target="< 10 s",
        )
    )
    return rows
