"""The package as pip sees it: a plain install pulls no torch (torch is the `torch` extra), the license is an SPDX
expression with its file shipped, and the build prints no warning."""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import trainplan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a copy of the project (the work tree stays clean), and the build's output."""
    project = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "src" / "trainplan", project / "src" / "trainplan", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "src" / "_trainplan_entry.py", project / "src" / "_trainplan_entry.py")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", "dist", "."],
        cwd=project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = (project / "dist").glob("trainplan-*.whl")
    return wheel, result.stdout + result.stderr


def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(item for item in archive.namelist() if item.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


def test_the_build_prints_no_warning(built: tuple[Path, str]) -> None:
    _, output = built
    # pip's notes about this machine's index locations are the machine's, not the project's.
    warnings = [
        line
        for line in output.splitlines()
        if re.search(r"warning", line, re.IGNORECASE) and "is ignored: it is neither a file nor a directory" not in line
    ]
    assert warnings == []


def test_a_plain_install_pulls_no_torch(built: tuple[Path, str]) -> None:
    wheel, _ = built
    requirements = [Requirement(text) for text in metadata(wheel).get_all("Requires-Dist") or []]
    plain = sorted(requirement.name for requirement in requirements if requirement.marker is None)
    assert plain == ["argcomplete", "attrs", "nvidia-ml-py", "python-dotenv"]
    (torch,) = [r for r in requirements if r.name == "torch" and r.marker is not None and "torch" in str(r.marker)]
    assert torch.marker is not None and torch.marker.evaluate({"extra": "torch"})
    assert torch.specifier.contains("2.13.0"), "the Makefile installs the local 2.13.0 build first"


def test_license_classifiers_keywords_and_files(built: tuple[Path, str]) -> None:
    wheel, _ = built
    data = metadata(wheel)
    assert data["License-Expression"] == "Apache-2.0" and data["License"] is None, "an SPDX string, not a table"
    assert data["License-File"] == "LICENSE"
    assert data["Version"] == trainplan.__version__
    classifiers = data.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3.10" in classifiers
    assert "torchrun" in (data["Keywords"] or "")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(name for name in names if name.endswith("entry_points.txt"))).decode()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert {"trainplan/py.typed", "trainplan/__main__.py", "trainplan/_version.py", "_trainplan_entry.py"} <= set(names)
    assert {f"trainplan/schemas/{name}.schema.json" for name in ("plan", "error", "problems", "probe")} <= set(names)
    # The console script starts outside the package, so that Ctrl-C while trainplan is imported is one line.
    assert "trainplan = _trainplan_entry:main" in entry_points
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"], (
        "the project's license"
    )
