"""probe(): facts of this machine, with the GPU driver behind an injected inventory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainplan import GpuFacts
from trainplan.effects import ProbeError, probe
from trainplan.resolve.visible import AmbiguousDevice, visible_device_order

UUIDS = ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-bbbc3333", "GPU-dddd4444"]


class FakeInventory:
    def __init__(self, uuids: list[str] | None) -> None:
        self.uuids = uuids

    def gpus(self) -> list[GpuFacts] | None:
        return None if self.uuids is None else [GpuFacts(uuid=uuid) for uuid in self.uuids]


class TestVisibleDevices:
    """CUDA's own reading of CUDA_VISIBLE_DEVICES (as torch implements it)."""

    @pytest.mark.parametrize(
        ("value", "order"),
        [
            (None, (0, 1, 2, 3)),
            ("", ()),
            ("-1", ()),
            ("2,0", (2, 0)),
            ("1gpu2,3", (1, 3)),
            ("0,7,1", (0,)),
            ("0,-1,1", (0,)),
            ("1,1", ()),
            ("GPU-dddd,GPU-aaaa", (3, 0)),
            ("GPU-aaaa,GPU-zzzz,GPU-dddd", (0,)),
            ("GPU-aaaa,1", (0,)),
            ("GPU-aaaa,GPU-aaaa1111", ()),
        ],
    )
    def test_forms(self, value: str | None, order: tuple[int, ...]) -> None:
        assert visible_device_order(value, UUIDS) == order

    def test_ambiguous_prefix_is_an_error(self) -> None:
        with pytest.raises(AmbiguousDevice):
            visible_device_order("GPU-bbb", UUIDS)


def test_probe_counts_visible_gpus_through_the_inventory() -> None:
    env = probe(environ={"CUDA_VISIBLE_DEVICES": "3,1"}, nvml=FakeInventory(UUIDS))
    assert env.cuda_device_count == 2
    assert env.variables["CUDA_VISIBLE_DEVICES"] == "3,1"


def test_probe_without_a_driver_sees_no_gpu() -> None:
    assert probe(environ={}, nvml=FakeInventory(None)).cuda_device_count == 0


def test_probe_keeps_only_relevant_variables() -> None:
    env = probe(environ={"SLURM_NTASKS": "2", "HOME": "/root", "RANK": "0"}, nvml=FakeInventory(None))
    assert dict(env.variables) == {"SLURM_NTASKS": "2", "RANK": "0"}


def test_probe_reports_an_ambiguous_uuid() -> None:
    with pytest.raises(ProbeError, match="longer UUID prefix"):
        probe(environ={"CUDA_VISIBLE_DEVICES": "GPU-bbb"}, nvml=FakeInventory(UUIDS))


def test_probe_on_this_machine_neither_imports_torch_nor_initialises_cuda() -> None:
    code = (
        "import sys, trainplan\n"
        "env = trainplan.probe()\n"
        "assert 'torch' not in sys.modules, 'probe imported torch'\n"
        "assert env.cpu_count >= 1 and 'spawn' in env.start_methods\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(env.cuda_device_count)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
