"""The bug report's text (`trainplan env`), and which environment variables it shows, masked where they look secret.

Pure: the facts come gathered (`effects.report.bug_report`); this module decides what is shown and how.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from trainplan.rules import RELEVANT_VARIABLE_PREFIXES, RELEVANT_VARIABLES
from trainplan.spec.gpus import GpuFacts
from trainplan.spec.report import BugReport, DriverFacts, TorchFacts

REPORT_VARIABLE_PREFIXES: tuple[str, ...] = (
    *RELEVANT_VARIABLE_PREFIXES,
    "CUDA_",
    "NCCL_",
    "GLOO_",
    "TORCH_",
    "PYTORCH_",
    "NVIDIA_",
    "OMP_",
    "MKL_",
    "KMP_",
    "PL_",
    "LIGHTNING_",
    "ACCELERATE_",
    "XLA_",
    "TPU_",
    "PJRT_",
    "KUBERNETES_",
)
"""The variables a bug report shows besides the planner's own (`rules.RELEVANT_VARIABLES`): those that change
how torch, its collectives, its threads and the frameworks behave."""

MASK = "<masked>"

_SECRET_NAME_PARTS = frozenset(
    {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "KEY", "APIKEY", "CREDENTIAL", "CREDENTIALS", "AUTH", "PRIVATE"}
)
"""A variable whose name has one of these words (split at `_`, `-` and `.`) holds a secret: HF_TOKEN,
WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, LIGHTNING_API_KEY, ..."""

_SECRET_PREFIXES = (
    *("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-"),
    *("hf_", "sk-", "xoxb-", "xoxp-", "AKIA"),
)
"""Values that are tokens whatever their variable is called (GitHub, GitLab, Hugging Face, OpenAI-style, Slack
and AWS access keys)."""

_USERINFO_IN_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
"""A URL's user information (`https://TOKEN@host`, `https://user:password@host`): a token as the user is as
secret as a password."""
_CREDENTIALS_WITHOUT_SCHEME = re.compile(r"(?<![^\s,;=])[^\s/@:,;=]+:[^\s/@,;]*@(?=[^\s@])")
"""`user:password@host` without a scheme (`MASTER_ADDR=admin:hunter2@10.0.0.1`)."""

LONG_VALUE = 160
"""Characters of a value the text report shows (a plan's JSON is longer); `--json` shows it whole."""


def reported_variable(name: str) -> bool:
    """Whether a bug report shows this environment variable."""
    return name in RELEVANT_VARIABLES or name.startswith(REPORT_VARIABLE_PREFIXES)


def looks_secret(name: str, value: str) -> bool:
    """Whether a variable's whole value should be masked: its name says secret, or its value is a known kind
    of token. (A password inside a URL is masked by `masked` alone.)"""
    parts = {part for part in re.split(r"[_\-.]", name.upper()) if part}
    return bool(parts & _SECRET_NAME_PARTS) or value.strip().startswith(_SECRET_PREFIXES)


def masked(name: str, value: str) -> str:
    """The value as a bug report shows it: whole secrets masked, the user information in an address masked
    (`https://<masked>@host`, and `<masked>@host` for `user:password@host` without a scheme)."""
    if value and looks_secret(name, value):
        return MASK
    value = _USERINFO_IN_URL.sub(lambda match: f"{match['scheme']}{MASK}@", value)
    return _CREDENTIALS_WITHOUT_SCHEME.sub(f"{MASK}@", value)


def shown_value(value: str) -> str:
    """A value as the text report prints it: as written, or escaped and quoted (as Python's repr) when it holds
    a control character, so a newline or an escape code cannot forge a line of the report."""
    return value if value.isprintable() else repr(value)


def report_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a bug report shows, sorted, masked."""
    return {name: masked(name, environ[name]) for name in sorted(environ) if reported_variable(name)}


# --------------------------------------------------------------------------------------------------
# Rendering


def _torch_line(torch: TorchFacts) -> str:
    if not torch.installed:
        return "not installed (the planner needs none; launch, metrics and the runtime: pip install 'trainplan[torch]')"
    if torch.problem:
        return f"installed, but it cannot be imported: {torch.problem}"
    parts = [f"CUDA build: {torch.cuda or 'none'}"]
    if torch.hip:
        parts.append(f"HIP build: {torch.hip}")
    parts += [f"cuDNN: {torch.cudnn or 'none'}", f"NCCL: {torch.nccl or 'none'}"]
    return f"{torch.version} ({', '.join(parts)})"


def _gpu_text(index: int, gpu: GpuFacts) -> str:
    memory = "" if gpu.memory_total is None else f"{gpu.memory_total / 2**30:.1f} GiB, "
    mig = f", MIG with {len(gpu.mig_devices)} device(s)" if gpu.mig_enabled else ""
    return f"{index}: {gpu.name or gpu.uuid} ({memory}compute mode {gpu.compute_mode}{mig})"


def _driver_lines(driver: DriverFacts) -> list[str]:
    if not driver.available:
        return [f"- NVIDIA driver: not available through NVML ({driver.reason})"]
    cuda = f", CUDA {driver.cuda_driver_version}" if driver.cuda_driver_version else ""
    lines = [f"- NVIDIA driver: {driver.driver_version or 'unknown'}{cuda} (NVML)"]
    if not driver.gpus:
        lines.append("- GPUs (NVML): none")
    else:
        lines.append(f"- GPUs (NVML): {len(driver.gpus)}")
        lines += [f"    {_gpu_text(index, gpu)}" for index, gpu in enumerate(driver.gpus)]
    return lines


def _fact_text(value: object) -> str:
    if isinstance(value, (frozenset, set)):
        return ", ".join(sorted(str(item) for item in value)) or "none"
    if isinstance(value, tuple):
        return ", ".join(str(item) for item in value) or "none"
    if isinstance(value, Mapping):
        return ", ".join(f"{key}={item}" for key, item in value.items()) or "none"
    return str(value)


def _shortened(value: str) -> str:
    if len(value) <= LONG_VALUE:
        return value
    return f"{value[:LONG_VALUE]}... ({len(value)} characters; trainplan env --json shows them all)"


def render_report(report: BugReport) -> str:
    """The copy-paste block `trainplan env` prints."""
    lines = [
        "trainplan env: paste this block into a bug report (secret-looking values are masked)",
        "",
        f"- trainplan: {report.trainplan}",
        f"- Python: {report.python}",
        f"- OS: {report.system}",
        f"- RAM: {'unknown' if report.memory is None else f'{report.memory / 2**30:.1f} GiB'}",
        f"- torch: {_torch_line(report.torch)}",
        *_driver_lines(report.driver),
        "- probe:",
    ]
    for field in attrs.fields(type(report.environment)):
        if field.name != "variables":  # shown below, masked
            lines.append(f"    {field.name}: {_fact_text(getattr(report.environment, field.name))}")
    installed = [f"{name} {version}" for name, version in report.packages if version is not None]
    absent = [name for name, version in report.packages if version is None]
    lines.append(f"- packages: {', '.join(installed) or 'none'}")
    if absent:
        lines.append(f"- not installed: {', '.join(absent)}")
    if report.variables:
        lines.append("- environment variables:")
        lines += [f"    {name}={_shortened(shown_value(value))}" for name, value in report.variables.items()]
    else:
        lines.append("- environment variables: none that matter here")
    return "\n".join(lines)


def report_to_dict(report: BugReport) -> dict[str, object]:
    """The report as plain JSON data (`trainplan env --json`)."""
    environment = {
        field.name: _plain(getattr(report.environment, field.name))
        for field in attrs.fields(type(report.environment))
        if field.name != "variables"
    }
    return {
        "trainplan": report.trainplan,
        "python": report.python,
        "system": report.system,
        "memory": report.memory,
        "torch": attrs.asdict(report.torch),
        "driver": {
            **{key: value for key, value in attrs.asdict(report.driver, recurse=False).items() if key != "gpus"},
            "gpus": [attrs.asdict(gpu) for gpu in report.driver.gpus],
        },
        "probe": environment,
        "packages": dict(report.packages),
        "variables": dict(report.variables),
    }


def _plain(value: object) -> object:
    if isinstance(value, (frozenset, set)):
        return sorted(str(item) for item in value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):  # the device counts a framework supplied
        return {str(key): item for key, item in value.items()}
    return value


__all__ = [
    "MASK",
    "REPORT_VARIABLE_PREFIXES",
    "looks_secret",
    "masked",
    "render_report",
    "report_to_dict",
    "report_variables",
    "reported_variable",
    "shown_value",
]
