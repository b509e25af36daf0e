"""Where a method's memory lives: device maps, buffer placement, device availability."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..device import CPU, Device, DeviceType, parse_device, schema_device
from ..errors import DeviceUnavailableError, PteFormatError
from ..format import program as p
from ..format.lru import Key, Lru
from ..memory import BufferInfo

__all__ = [
    "DeviceMap",
    "DeviceMapSpec",
    "buffer_infos",
    "check_device_available",
    "clear_placements",
    "value_devices",
]

DeviceMapSpec = None | str | torch.device | Device | Mapping[Any, Any]


# the keys of the device maps met, interned (the first few: the maps callers pass)
_MAP_KEYS = 64
_map_keys: dict[Key, Key] = {}


class DeviceMap:
    """torch's ``map_location`` convention: one target for everything, or ``{from: to}``
    where ``from`` is a device (``"cuda:1"``) or a device type (``"cuda"``)."""

    def __init__(self, spec: DeviceMapSpec = None) -> None:
        self.target: Device | None = None
        self.exact: dict[Device, Device] = {}
        self.by_type: dict[DeviceType, Device] = {}
        self._labels: dict[tuple[int, int], Device] = {}  # a program's label -> the device
        self._key: Key | None = None
        if spec is None:
            return
        if isinstance(spec, Mapping):
            for key, value in spec.items():
                to = parse_device(value)
                if isinstance(key, str) and key.strip().lower() in ("cpu", "cuda"):
                    if key.strip().lower() == "cpu":
                        self.exact[CPU] = to
                    else:
                        self.by_type[DeviceType.CUDA] = to
                else:
                    self.exact[parse_device(key)] = to
        else:
            self.target = parse_device(spec)

    def __call__(self, device: Device) -> Device:
        if self.target is not None:
            return self.target
        hit = self.exact.get(device)
        if hit is not None:
            return hit
        return self.by_type.get(device.type, device)

    def label(self, t: p.Tensor) -> Device:
        """The device of program tensor ``t`` after mapping."""
        key = t.device
        hit = self._labels.get(key)
        if hit is None:
            hit = self._labels[key] = self(schema_device(*key))
        return hit

    @property
    def key(self) -> Key:
        """What the mapping is (equal for maps that map every device alike)."""
        key = self._key
        if key is None:
            exact, by_type = frozenset(self.exact.items()), frozenset(self.by_type.items())
            key = Key(self.target, exact, by_type)
            # one object per mapping: keys holding it compare it by identity
            if len(_map_keys) < _MAP_KEYS or key in _map_keys:
                key = _map_keys.setdefault(key, key)
            self._key = key
        return key

    @property
    def is_identity(self) -> bool:
        return self.target is None and not self.exact and not self.by_type


def check_device_available(device: Device, method: str, what: str) -> None:
    """Raise :class:`DeviceUnavailableError` if ``device`` cannot be used here."""
    if device.is_cpu:
        return
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"method '{method}' needs memory on device {device} ({what}) but torch has no "
            "CUDA device here",
            f"load it with device_map='cpu' (or {{'{device}': 'cpu'}}) to run it on the CPU",
            str(device),
        )
    count = torch.cuda.device_count()
    if device.index >= count:
        raise DeviceUnavailableError(
            f"method '{method}' needs memory on device {device} ({what}) but this machine "
            f"has {count} CUDA device(s)",
            f"map it with device_map={{'{device}': 'cuda:0'}}",
            str(device),
            count,
        )


# a plan's buffers and its values' devices under one map: pure functions of the decoded
# plan (shared by the loads of the same bytes) and the map, kept for loading it again
_infos: Lru[tuple[p.ExecutionPlan, tuple[BufferInfo, ...]]] = Lru(256, 0)
_labels: Lru[tuple[p.ExecutionPlan, tuple[Device | None, ...]]] = Lru(256, 0)


def clear_placements() -> None:
    """Forget the kept buffer placements and value devices."""
    _infos.clear()
    _labels.clear()


def value_devices(plan: p.ExecutionPlan, dmap: DeviceMap) -> tuple[Device | None, ...]:
    """The device of each value of ``plan`` under ``dmap`` (None: not a tensor); the same
    tuple for the loads of one plan under one map (while it is kept)."""
    key = Key(id(plan), dmap.key)
    hit = _labels.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    found = tuple(dmap.label(v) if isinstance(v, p.Tensor) else None for v in plan.values)
    _labels.put(key, (plan, found))  # the plan kept alive: its id stays its own
    return found


def buffer_infos(
    plan: p.ExecutionPlan, dmap: DeviceMap, shared: frozenset[int], path: str
) -> list[BufferInfo]:
    """Each planned buffer with its size and device: its ``non_const_buffer_device`` entry,
    else the CPU; a buffer without an entry whose tensors all name one other device
    (legacy tagging) is placed there. Tensors that disagree with their buffer, or with
    each other, are a :class:`PteFormatError` (found on every load: only placements that
    passed are kept)."""
    key = Key(id(plan), dmap.key, shared, path)
    hit = _infos.get(key)
    if hit is not None and hit[0] is plan:
        return list(hit[1])
    infos = _buffer_infos(plan, dmap, shared, path)
    _infos.put(key, (plan, tuple(infos)))
    return infos


def _buffer_infos(
    plan: p.ExecutionPlan, dmap: DeviceMap, shared: frozenset[int], path: str
) -> list[BufferInfo]:
    sizes = plan.non_const_buffer_sizes
    listed = {e.buffer_idx for e in plan.non_const_buffer_device or ()}
    labels: dict[int, set[Device]] = {}
    for value in plan.values:
        if isinstance(value, p.Tensor) and value.allocation_info is not None:
            labels.setdefault(value.allocation_info.memory_id, set()).add(dmap.label(value))
    infos = []
    for idx in range(1, len(sizes)):
        device = dmap(schema_device(*plan.buffer_device(idx)))
        source = "program" if dmap.is_identity else "device_map"
        seen = labels.get(idx, set())
        if idx not in listed and len(seen) == 1:
            (only,) = seen
            if only != device:
                device, source = only, "tensors"
        if len(seen) > 1 or (seen and device not in seen):
            raise PteFormatError(
                f"{path}.non_const_buffer_sizes[{idx}]",
                f"buffer {idx} is on {device} but its tensors name "
                + ", ".join(sorted(str(d) for d in seen)),
            )
        infos.append(BufferInfo(idx, sizes[idx], device, source, idx in shared))
    return infos
