"""`trainplan env`: a bug report with the versions, the driver and its GPUs, the probe's facts, the variables that
matter (secrets masked) and the packages; it never creates a CUDA context, and works without torch
(`tests/unit/test_without_torch.py` runs it where torch cannot be imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import trainplan
from trainplan.effects.report import bug_report, package_versions
from trainplan.render.report import (
    MASK,
    looks_secret,
    masked,
    render_report,
    report_to_dict,
    report_variables,
    shown_value,
)
from trainplan.spec.gpus import GpuFacts
from trainplan.spec.report import BugReport, DriverFacts, TorchFacts

H200 = GpuFacts(uuid="GPU-0000", name="NVIDIA H200", memory_total=141 * 2**30, compute_mode="default")


class FakeDriver:
    def __init__(self, facts: DriverFacts) -> None:
        self.facts = facts

    def driver(self) -> DriverFacts:
        return self.facts


def built_torch() -> TorchFacts:
    return TorchFacts(installed=True, version="2.13.0+cu130", cuda="13.0", cudnn="91002", nccl="2.27.7")


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("LIGHTNING_API_KEY", "abc123", MASK),
        ("TORCH_HUB_TOKEN", "anything", MASK),
        ("NCCL_IB_PASSWORD", "x", MASK),
        ("CUDA_SECRET", "x", MASK),
        ("NCCL_DEBUG", "INFO", "INFO"),
        ("MASTER_ADDR", "node001", "node001"),
        (
            "CUDA_VISIBLE_DEVICES",
            "GPU-1a2b3c4d-0000-1111-2222-333344445555",
            "GPU-1a2b3c4d-0000-1111-2222-333344445555",
        ),
        ("PL_CALLBACK", "ghp_0123456789abcdef", MASK),  # a GitHub token, whatever the variable is called
        ("TORCH_HOME", "https://alice:s3cret@mirror.example/torch", f"https://{MASK}@mirror.example/torch"),
        ("TORCH_HOME", "https://mirror.example/torch", "https://mirror.example/torch"),
        ("MASTER_ADDR", "admin:hunter2@10.0.0.1", f"{MASK}@10.0.0.1"),  # credentials without a scheme
        ("TORCH_HUB_URL", "https://ghp_abc123@github.com/x", f"https://{MASK}@github.com/x"),  # a token as the user
        ("NCCL_SOCKET_IFNAME", "eth0,ib0", "eth0,ib0"),
        ("TORCH_HOME", "git@github.com:x/y", "git@github.com:x/y"),  # a user name alone is no secret
        ("MONKEY_BUSINESS", "visible", "visible"),  # "KEY" inside a word is not the word KEY
    ],
)
def test_secret_looking_values_are_masked(name: str, value: str, shown: str) -> None:
    assert masked(name, value) == shown
    assert looks_secret(name, value) == (shown == MASK)


def test_the_report_shows_the_variables_that_matter_and_nothing_else() -> None:
    environ = {
        "NCCL_DEBUG": "INFO",
        "OMP_NUM_THREADS": "4",
        "SLURM_PROCID": "3",
        "LIGHTNING_API_KEY": "abc",
        "HF_TOKEN": "hf_secret",  # not a variable a run reads: not shown at all
        "HOME": "/home/alice",
        "PATH": "/usr/bin",
    }
    assert report_variables(environ) == {
        "LIGHTNING_API_KEY": MASK,
        "NCCL_DEBUG": "INFO",
        "OMP_NUM_THREADS": "4",
        "SLURM_PROCID": "3",
    }


def test_the_report_names_versions_driver_gpus_facts_variables_and_packages() -> None:
    driver = DriverFacts(available=True, driver_version="550.54.15", cuda_driver_version="12.4", gpus=(H200, H200))
    environ = {"CUDA_VISIBLE_DEVICES": "1", "NCCL_DEBUG": "INFO", "WANDB_API_KEY": "k"}
    report = bug_report(environ=environ, driver=FakeDriver(driver), torch=built_torch)
    text = render_report(report)
    assert text.startswith("trainplan env: paste this block into a bug report")
    for line in (
        f"- trainplan: {trainplan.__version__}",
        f"- Python: {sys.version_info.major}.{sys.version_info.minor}.",
        "- OS: ",
        "- torch: 2.13.0+cu130 (CUDA build: 13.0, cuDNN: 91002, NCCL: 2.27.7)",
        "- NVIDIA driver: 550.54.15, CUDA 12.4 (NVML)",
        "- GPUs (NVML): 2",
        "    0: NVIDIA H200 (141.0 GiB, compute mode default)",
        "    1: NVIDIA H200 (141.0 GiB, compute mode default)",
        "    cpu_count: ",
        "    start_methods: ",
        "    CUDA_VISIBLE_DEVICES=1",
        "    NCCL_DEBUG=INFO",
    ):
        assert line in text, line
    assert "WANDB_API_KEY" not in text and "nvidia-ml-py" in text
    data = json.loads(json.dumps(report_to_dict(report)))
    assert data["driver"]["gpus"][1]["name"] == "NVIDIA H200" and data["torch"]["cuda"] == "13.0"
    assert data["probe"]["cuda_device_count"] == 1, "the probe's facts, CUDA_VISIBLE_DEVICES applied"


def test_the_report_says_what_is_missing() -> None:
    driver = DriverFacts(available=False, reason="no NVIDIA driver here: NVML Shared Library Not Found")
    report = bug_report(environ={}, driver=FakeDriver(driver), torch=lambda: TorchFacts(installed=False))
    text = render_report(report)
    assert "- torch: not installed" in text and "pip install 'trainplan[torch]'" in text
    assert "- NVIDIA driver: not available through NVML (no NVIDIA driver here: NVML Shared Library" in text
    assert "- environment variables: none that matter here" in text


def test_a_long_value_is_cut_short_in_text_but_whole_in_json() -> None:
    plan_json = json.dumps({"padding": "x" * 500})
    report = bug_report(
        environ={"TRAINPLAN_PLAN": plan_json},
        driver=FakeDriver(DriverFacts(available=False, reason="none")),
        torch=lambda: TorchFacts(installed=False),
    )
    assert f"({len(plan_json)} characters; trainplan env --json shows them all)" in render_report(report)
    assert report_to_dict(report)["variables"] == {"TRAINPLAN_PLAN": plan_json}


def test_package_versions_come_from_metadata_without_importing() -> None:
    versions = dict(package_versions(("attrs", "surely-not-installed-package")))
    assert versions["attrs"] is not None and versions["surely-not-installed-package"] is None


def test_env_in_a_fresh_interpreter_creates_no_cuda_context() -> None:
    """Every torch.cuda entry point that could initialise CUDA (or the driver) is replaced by a spy that fails; the
    report must come out all the same, and CUDA stay uninitialised."""
    code = textwrap.dedent(
        """
        import sys
        import torch

        touched = []

        def spy(name):
            def call(*args, **kwargs):
                touched.append(name)
                raise AssertionError(f"trainplan env called torch.cuda.{name}")
            return call

        for name in ("init", "_lazy_init", "is_available", "device_count", "current_device", "get_device_name",
                     "get_device_properties", "get_device_capability", "mem_get_info", "synchronize", "set_device"):
            setattr(torch.cuda, name, spy(name))

        from trainplan.cli import main

        code = main(["env"])
        assert code == 0, code
        assert not touched, touched
        assert not torch.cuda.is_initialized(), "CUDA was initialised"
        print("CLEAN")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr
    assert "- torch: 2." in result.stdout and result.stdout.rstrip().endswith("CLEAN")


def test_env_as_json_from_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    from trainplan.cli import main

    assert main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["trainplan"] == trainplan.__version__ and data["torch"]["installed"] is True
    assert set(data) == {
        "version",
        "trainplan",
        "python",
        "system",
        "memory",
        "torch",
        "driver",
        "probe",
        "packages",
    } | {"variables"}
    assert data["memory"] is None or data["memory"] > 2**20, "the machine's RAM in bytes"


def test_a_value_with_control_characters_is_shown_escaped_and_cannot_forge_a_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = BugReport(
        trainplan="0",
        python="3",
        system="Linux",
        torch=TorchFacts(installed=False),
        driver=DriverFacts(available=False),
        environment=trainplan.Environment(),
        packages=(),
        variables=report_variables({"CUDA_X": "1\n- torch: 9.9 fake", "NCCL_DEBUG": "\x1b[2Jinfo"}),
    )
    text = render_report(report)
    assert "    CUDA_X='1\\n- torch: 9.9 fake'" in text.splitlines()
    assert "    NCCL_DEBUG='\\x1b[2Jinfo'" in text.splitlines()
    assert "\x1b" not in text and not any(line.startswith("- torch: 9.9") for line in text.splitlines())
    assert shown_value("plain value") == "plain value"
