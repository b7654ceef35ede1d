"""The objects torch and the frameworks take for an option: what an `Encoded` value of `mapping.frameworks` becomes
(a `timedelta`, torch's `ShardingStrategy` or `CPUOffload`, a 2-D `DeviceMesh`), one builder per `rules.Encoding`."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any, Final

from trainplan.mapping.frameworks import Encoded
from trainplan.rules import Encoding


def _plain(value: object, device_type: str | None) -> object:
    return value


def _timedelta(value: object, device_type: str | None) -> datetime.timedelta:
    return datetime.timedelta(seconds=value if isinstance(value, (int, float)) else float(str(value)))


def _sharding_strategy(value: object, device_type: str | None) -> object:
    from torch.distributed.fsdp import ShardingStrategy

    return ShardingStrategy[str(value)]


def _cpu_offload(value: object, device_type: str | None) -> object:
    from torch.distributed.fsdp import CPUOffload

    return CPUOffload(offload_params=value is True)


def _device_mesh(value: object, device_type: str | None) -> object:
    """A (replicate × shard) mesh of the given shape over `device_type`: a collective, every rank builds it."""
    from torch.distributed.device_mesh import init_device_mesh

    if device_type is None:
        raise TypeError("a device mesh spans devices of one type: name it")
    shape: Any = value
    return init_device_mesh(device_type, tuple(shape), mesh_dim_names=("replicate", "shard"))


BUILDERS: Final[Mapping[Encoding, Callable[[object, str | None], object]]] = {
    "plain": _plain,
    "timedelta": _timedelta,
    "ShardingStrategy": _sharding_strategy,
    "CPUOffload": _cpu_offload,
    "DeviceMesh": _device_mesh,
}
"""What each encoding builds from a plain value (and the device type a mesh spans)."""


def built(arguments: Mapping[str, object], device_type: str | None = None) -> dict[str, Any]:
    """`arguments` with each `Encoded` value built into the object its target takes (on `device_type` where it
    spans devices); the others as they are."""
    return {
        key: BUILDERS[value.encoding](value.value, device_type) if isinstance(value, Encoded) else value
        for key, value in arguments.items()
    }


__all__ = ["BUILDERS", "built"]
