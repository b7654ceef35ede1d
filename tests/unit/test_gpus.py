"""Usable GPUs: NVML facts decide where they can, child-process probes confirm the rest, in parallel."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import ModuleType, SimpleNamespace

import pytest

from trainplan import GpuFacts, InvalidRequest, Request, Unavailable, find_usable_cuda_devices, gpu_statuses
from trainplan.effects import ProbeOutcome, PynvmlQuery, SubprocessProbeLauncher, probe
from trainplan.effects.gpus import GpuProbeError, probe_in_parallel
from trainplan.resolve.gpus import judge, visible_gpus


def gpu(number: int, **facts: object) -> GpuFacts:
    values: dict[str, object] = {
        "uuid": f"GPU-{number:04d}-aaaa",
        "name": "NVIDIA H200",
        "memory_total": 141 * 2**30,
        "memory_used": 0,
        "compute_mode": "default",
        "running_pids": (),
    }
    values.update(facts)
    return GpuFacts(**values)  # type: ignore[arg-type]


class FakeNvml:
    def __init__(self, gpus: list[GpuFacts] | None) -> None:
        self.found = gpus

    def gpus(self) -> list[GpuFacts] | None:
        return self.found


class FakeProbe:
    def __init__(self, launcher: FakeLauncher, index: int, outcome: ProbeOutcome | None, latency: float) -> None:
        self.launcher = launcher
        self.index = index
        self.outcome = outcome
        self.started = time.monotonic()
        self.finish_at = self.started + latency
        self.killed = False

    def poll(self) -> ProbeOutcome | None:
        if self.outcome is None or time.monotonic() < self.finish_at:
            return None
        self.launcher.finished.setdefault(self.index, time.monotonic())
        return self.outcome

    def kill(self) -> None:
        self.killed = True


class FakeLauncher:
    """Probes that answer after `latency` seconds (or never, for indices in `hang`)."""

    def __init__(self, *, latency: float = 0.05, errors: dict[int, str] | None = None, hang: set[int] | None = None):
        self.latency = latency
        self.errors = errors or {}
        self.hang = hang or set()
        self.probes: dict[int, FakeProbe] = {}
        self.finished: dict[int, float] = {}

    def start(self, index: int) -> FakeProbe:
        if index in self.hang:
            outcome = None
        elif index in self.errors:
            outcome = ProbeOutcome("error", self.errors[index])
        else:
            outcome = ProbeOutcome("ok")
        self.probes[index] = FakeProbe(self, index, outcome, self.latency)
        return self.probes[index]


class TestJudge:
    """The verdict from NVML's facts: usable, busy with a reason, or unknown (then probed)."""

    def test_default_mode_is_usable_even_when_shared(self) -> None:
        assert judge(gpu(0, running_pids=(11, 12))).usable is True

    def test_exclusive_held_names_the_pid(self) -> None:
        verdict = judge(gpu(0, compute_mode="exclusive_process", running_pids=(4242,)))
        assert verdict.usable is False and verdict.reason == "exclusive-process mode, held by pid 4242"

    def test_exclusive_free_is_usable(self) -> None:
        assert judge(gpu(0, compute_mode="exclusive_process", running_pids=())).usable is True

    def test_exclusive_with_unknown_processes_needs_a_probe(self) -> None:
        assert judge(gpu(0, compute_mode="exclusive_process", running_pids=None)).usable is None

    def test_prohibited(self) -> None:
        verdict = judge(gpu(0, compute_mode="prohibited"))
        assert verdict.usable is False and "Prohibited" in (verdict.reason or "")

    def test_mig_enabled_gpu_points_to_its_instances(self) -> None:
        verdict = judge(gpu(0, mig_enabled=True, mig_devices=(GpuFacts(uuid="MIG-1111"),)))
        assert verdict.usable is False and "MIG-1111" in (verdict.reason or "")

    def test_mig_enabled_gpu_without_instances_says_none_are_created(self) -> None:
        verdict = judge(gpu(0, mig_enabled=True, mig_devices=()))
        assert verdict.usable is False
        assert verdict.reason == (
            "MIG is enabled, so work runs on its MIG devices (none created yet); select one with "
            "CUDA_VISIBLE_DEVICES=MIG-<uuid>"
        )

    def test_unknown_mode_needs_a_probe(self) -> None:
        assert judge(gpu(0, compute_mode="unknown")).usable is None


class TestVisibleGpus:
    GPUS = (
        gpu(0),
        gpu(1, mig_enabled=True, mig_devices=(GpuFacts(uuid="MIG-aaaa"), GpuFacts(uuid="MIG-bbbb"))),
        gpu(2),
    )

    @pytest.mark.parametrize(
        ("value", "uuids"),
        [
            (None, ["GPU-0000-aaaa", "GPU-0001-aaaa", "GPU-0002-aaaa"]),
            ("2,0", ["GPU-0002-aaaa", "GPU-0000-aaaa"]),
            ("", []),
            ("0,5,2", ["GPU-0000-aaaa"]),
            ("GPU-0002,GPU-0000", ["GPU-0002-aaaa", "GPU-0000-aaaa"]),
            ("MIG-bbbb", ["MIG-bbbb"]),
            ("MIG-bbbb,MIG-aaaa", ["MIG-bbbb", "MIG-aaaa"]),
            ("MIG-zzzz", []),
        ],
    )
    def test_every_form(self, value: str | None, uuids: list[str]) -> None:
        assert [device.uuid for device in visible_gpus(value, self.GPUS)] == uuids


class TestFindUsable:
    @pytest.mark.parametrize("count", [0, 1, 8])
    def test_all_free(self, count: int) -> None:
        nvml = FakeNvml([gpu(i) for i in range(count)])
        if count == 0:
            with pytest.raises(Unavailable, match="0 visible"):
                find_usable_cuda_devices(nvml=nvml, launcher=FakeLauncher(), environ={})
        else:
            assert find_usable_cuda_devices(nvml=nvml, launcher=FakeLauncher(), environ={}) == list(range(count))

    def test_zero_is_empty_without_probing(self) -> None:
        assert find_usable_cuda_devices(0, nvml=FakeNvml(None), launcher=FakeLauncher(), environ={}) == []

    def test_first_n_usable_in_index_order(self) -> None:
        nvml = FakeNvml(
            [
                gpu(0, compute_mode="exclusive_process", running_pids=(99,)),
                gpu(1),
                gpu(2, compute_mode="prohibited"),
                gpu(3),
                gpu(4),
            ]
        )
        assert find_usable_cuda_devices(2, nvml=nvml, launcher=FakeLauncher(), environ={}) == [1, 3]

    def test_visible_indices_follow_cuda_visible_devices(self) -> None:
        nvml = FakeNvml([gpu(0, compute_mode="prohibited"), gpu(1), gpu(2)])
        environ = {"CUDA_VISIBLE_DEVICES": "2,0"}
        assert find_usable_cuda_devices(-1, nvml=nvml, launcher=FakeLauncher(), environ=environ) == [0]

    def test_more_than_visible(self) -> None:
        with pytest.raises(Unavailable, match="2 visible CUDA device"):
            find_usable_cuda_devices(3, nvml=FakeNvml([gpu(0), gpu(1)]), launcher=FakeLauncher(), environ={})

    def test_not_enough_usable_names_each_busy_gpu_and_why(self) -> None:
        nvml = FakeNvml(
            [
                gpu(0, compute_mode="exclusive_process", running_pids=(1234,)),
                gpu(1, compute_mode="prohibited"),
                gpu(2, compute_mode="exclusive_process", running_pids=None),
                gpu(3, compute_mode="unknown"),
                gpu(4),
            ]
        )
        launcher = FakeLauncher(errors={2: "RuntimeError: CUDA error: all CUDA-capable devices are busy"}, hang={3})
        with pytest.raises(Unavailable) as caught:
            find_usable_cuda_devices(2, nvml=nvml, launcher=launcher, environ={}, timeout=0.3)
        message = str(caught.value)
        assert "1 usable of 5 visible" in message
        assert "GPU 0 (NVIDIA H200): exclusive-process mode, held by pid 1234" in message
        assert "GPU 1 (NVIDIA H200): compute mode is Prohibited" in message
        assert (
            "GPU 2 (NVIDIA H200): probe failed: RuntimeError: CUDA error: all CUDA-capable devices are busy" in message
        )
        assert "GPU 3 (NVIDIA H200): unresponsive: no answer within 0.3 s" in message
        assert launcher.probes[3].killed

    @pytest.mark.parametrize(("count", "timeout"), [(-2, 1.0), (True, 1.0), (1.5, 1.0), (1, 0), (1, -1.0)])
    def test_bad_arguments(self, count: object, timeout: object) -> None:
        with pytest.raises(InvalidRequest):
            find_usable_cuda_devices(count, timeout=timeout, nvml=FakeNvml([]), environ={})  # type: ignore[arg-type]

    def test_ambiguous_uuid(self) -> None:
        nvml = FakeNvml([gpu(0, uuid="GPU-ab1"), gpu(1, uuid="GPU-ab2")])
        with pytest.raises(GpuProbeError, match="longer UUID prefix"):
            gpu_statuses(nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "GPU-ab"})


class TestParallelProbes:
    def test_probes_run_concurrently(self) -> None:
        launcher = FakeLauncher(latency=0.1)
        outcomes = probe_in_parallel(list(range(8)), launcher, timeout=5)
        assert set(outcomes) == set(range(8)) and all(outcome.state == "ok" for outcome in outcomes.values())
        last_start = max(probe.started for probe in launcher.probes.values())
        first_finish = min(launcher.finished.values())
        assert last_start < first_finish, "every probe started before the first one finished"

    def test_hanging_probe_times_out_and_is_killed(self) -> None:
        launcher = FakeLauncher(latency=0.01, hang={1})
        outcomes = probe_in_parallel([0, 1], launcher, timeout=0.2)
        assert outcomes[0].state == "ok" and outcomes[1].state == "timeout"
        assert launcher.probes[1].killed and not launcher.probes[0].killed

    def test_real_child_processes_report_the_error_text(self) -> None:
        # This machine has no GPU: the real probe (torch in a fresh interpreter) fails, and says why.
        outcomes = probe_in_parallel([0, 1], SubprocessProbeLauncher(), timeout=120)
        assert {outcome.state for outcome in outcomes.values()} == {"error"}
        assert all(outcome.detail for outcome in outcomes.values())

    def test_real_hanging_child_is_killed(self) -> None:
        code = "import os, sys, time\nprint(os.getpid(), file=sys.stderr, flush=True)\ntime.sleep(60)\n"
        launcher = SubprocessProbeLauncher(probe_code=code)
        started = time.monotonic()
        outcomes = probe_in_parallel([0], launcher, timeout=1.0)
        assert outcomes[0].state == "timeout" and time.monotonic() - started < 30


class TestPynvml:
    """Our calls against a stand-in `pynvml` module with the real one's names (see typings/pynvml.pyi)."""

    def fake_module(self) -> ModuleType:
        class NVMLError(Exception):
            pass

        devices = {
            0: {"uuid": "GPU-0", "mode": 3, "pids": [SimpleNamespace(pid=77)], "mig": (0, 0)},
            1: {"uuid": "GPU-1", "mode": 0, "pids": [], "mig": (1, 1)},
            "mig-1-0": {"uuid": "MIG-10", "mode": 0, "pids": None, "mig": None},
        }

        def processes(handle: object) -> object:
            pids = devices[handle]["pids"]
            if pids is None:
                raise NVMLError("not supported")
            return pids

        def mig_mode(handle: object) -> object:
            mode = devices[handle]["mig"]
            if mode is None:
                raise NVMLError("not supported")
            return mode

        module = ModuleType("pynvml")
        namespace = {
            "NVMLError": NVMLError,
            "NVML_DEVICE_MIG_ENABLE": 1,
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlSystemGetCudaDriverVersion": lambda: 12040,
            "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": lambda index: index,
            "nvmlDeviceGetUUID": lambda handle: devices[handle]["uuid"],
            "nvmlDeviceGetName": lambda handle: b"NVIDIA A100",
            "nvmlDeviceGetMemoryInfo": lambda handle: SimpleNamespace(total=80 * 2**30, used=2**30, free=79 * 2**30),
            "nvmlDeviceGetComputeMode": lambda handle: devices[handle]["mode"],
            "nvmlDeviceGetComputeRunningProcesses": processes,
            "nvmlDeviceGetMigMode": mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": lambda handle: 1,
            "nvmlDeviceGetMigDeviceHandleByIndex": lambda handle, index: f"mig-{handle}-{index}",
        }
        module.__dict__.update(namespace)
        return module

    def test_facts_from_pynvml(self) -> None:
        facts = PynvmlQuery(self.fake_module()).gpus()
        assert facts is not None
        first, second = facts
        assert (first.uuid, first.name, first.compute_mode, first.running_pids) == (
            "GPU-0",
            "NVIDIA A100",
            "exclusive_process",
            (77,),
        )
        assert first.memory_total == 80 * 2**30 and not first.mig_enabled
        assert second.mig_enabled and [mig.uuid for mig in second.mig_devices] == ["MIG-10"]
        assert second.mig_devices[0].running_pids is None

    def test_statuses_through_pynvml(self) -> None:
        statuses = gpu_statuses(nvml=PynvmlQuery(self.fake_module()), launcher=FakeLauncher(), environ={})
        assert [(status.usable, status.checked_by) for status in statuses] == [(False, "nvml"), (False, "nvml")]
        assert statuses[0].reason == "exclusive-process mode, held by pid 77"

    def test_mig_device_by_uuid_is_probed(self) -> None:
        environ = {"CUDA_VISIBLE_DEVICES": "MIG-10"}
        statuses = gpu_statuses(nvml=PynvmlQuery(self.fake_module()), launcher=FakeLauncher(), environ=environ)
        assert [(status.uuid, status.usable, status.checked_by) for status in statuses] == [("MIG-10", True, "nvml")]

    def test_no_driver(self) -> None:
        module = self.fake_module()

        def fail() -> None:
            raise module.NVMLError("driver not loaded")

        module.nvmlInit = fail  # type: ignore[attr-defined]
        assert PynvmlQuery(module).gpus() is None


def test_probe_fills_usable_gpus_for_the_bridge() -> None:
    nvml = FakeNvml([gpu(0, compute_mode="prohibited"), gpu(1), gpu(2)])
    env = probe(environ={}, nvml=nvml, usable_gpus=True)
    assert env.cuda_device_count == 3 and env.usable_cuda_devices == (1, 2)
    from trainplan.resolve import resolve

    assert resolve(Request.from_legacy(gpus=2, auto_select_gpus=True), env).devices == (1, 2)


def test_caller_never_initialises_cuda() -> None:
    code = (
        "import torch, trainplan\n"
        "try:\n"
        "    trainplan.find_usable_cuda_devices(1, timeout=60)\n"
        "except trainplan.Unavailable:\n"
        "    pass\n"
        "print(trainplan.gpu_statuses())\n"
        "assert not torch.cuda.is_initialized(), 'CUDA was initialised in the caller'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr


def test_gpus_command_without_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    from trainplan.cli import main

    assert main(["gpus"]) == 0
    assert "no visible CUDA GPU" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["gpus", "2"])
    assert exit_.value.code == 2 and "asked for 2 usable GPU(s)" in capsys.readouterr().err


def test_driver_facts_from_pynvml() -> None:
    driver = PynvmlQuery(TestPynvml().fake_module()).driver()
    assert driver.available and (driver.driver_version, driver.cuda_driver_version) == ("550.54.15", "12.4")
    assert [gpu.uuid for gpu in driver.gpus] == ["GPU-0", "GPU-1"]


def test_without_the_driver_library_pynvml_is_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    def absent(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", absent)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    driver = PynvmlQuery().driver()
    assert not driver.available and driver.reason == "no NVIDIA driver here: NVML Shared Library Not Found"
    assert "pynvml" not in sys.modules


def test_driver_facts_say_why_nvml_cannot_answer() -> None:
    module = TestPynvml().fake_module()

    def fail() -> None:
        raise module.NVMLError("NVML Shared Library Not Found")

    module.nvmlInit = fail  # type: ignore[attr-defined]
    driver = PynvmlQuery(module).driver()
    assert not driver.available and driver.reason == "no NVIDIA driver here: NVML Shared Library Not Found"
