"""A package's lazy public names (trainplan.spec.lazy_names): loaded once on first read, kept, listed by `dir`, and any
other name is the AttributeError Python gives for a module."""

from __future__ import annotations

import types

import pytest

import trainplan
import trainplan.effects
import trainplan.spec
from trainplan.spec import lazy_names


def test_a_name_loads_its_module_once_and_is_kept() -> None:
    loaded: list[str] = []
    defining = types.ModuleType("defining")
    defining.Thing = object()  # type: ignore[attr-defined]

    def load(module: str) -> types.ModuleType:
        loaded.append(module)
        return defining

    namespace: dict[str, object] = {"__name__": "package", "helper": len}
    getattr_, dir_ = lazy_names("package", namespace, {"Thing": "defining"}, load, ["Thing"])
    assert getattr_("Thing") is defining.Thing and namespace["Thing"] is defining.Thing
    assert loaded == ["defining"]
    assert dir_() == ["Thing", "__name__"]  # the public names and the dunders, never a helper import
    with pytest.raises(AttributeError, match="module 'package' has no attribute 'Other'"):
        getattr_("Other")


@pytest.mark.parametrize("package", [trainplan, trainplan.spec, trainplan.effects])
def test_every_public_name_of_a_package_loads(package: types.ModuleType) -> None:
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match=f"module '{package.__name__}' has no attribute 'no_such_name'"):
        _ = package.no_such_name
