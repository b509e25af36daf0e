"""``manifest.json``: what a cache entry holds, as data with fixed types.

A manifest is read back from disk, where anyone who could write the file could have
written anything, and parts of it become generated code (a region's guards, the kind of
each scalar it returns). So it is never used as parsed JSON: :func:`parse` accepts exactly
the shape :meth:`Manifest.to_json` writes (every key present, no other key, every value of
its type: an int is an int and not a bool, a name is a bare file name, a kind is one of a
fixed set, a guard as :meth:`~.graph.Guard.from_json` reads it) and returns frozen records,
or raises one :class:`~ptexec.errors.CacheEntryError` that says where the manifest is wrong.

``files`` records each file of the entry (size and sha256) so that a library is checked
before it is loaded (:mod:`.cache`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CacheEntryError
from .graph import Guard, GuardError

if TYPE_CHECKING:
    from .regions import Region

__all__ = ["FailedRecord", "FileRecord", "Manifest", "RegionRecord", "parse", "valid_name"]

SCALAR_KINDS = ("int", "float", "bool")
STORE_HOWS = ("inplace", "copy", "replace", "adopt", "statement", "returned")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_MODEL = re.compile(r"r[0-9]{1,6}")
_DEVICE = re.compile(r"(cpu|cuda)(:[0-9]{1,3})?")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def valid_name(name: object) -> bool:
    """A bare file name: no directory, not hidden, not ``.`` or ``..``."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class FileRecord:
    size: int
    sha256: str


@dataclass(frozen=True)
class RegionRecord:
    """One compiled region: where it is in the method (compared with the region planned
    at load, never trusted), its guards and returned scalars' kinds, its model's name and
    file."""

    chain: int
    first: int
    last: int
    device: str
    inputs: tuple[int, ...]
    scalar_inputs: tuple[int, ...]
    stores: tuple[tuple[int, str, int], ...]
    aliases: tuple[tuple[int, int, int], ...]
    guards: tuple[Guard, ...]
    kinds: tuple[tuple[int, str], ...]
    model: str
    file: str

    @staticmethod
    def of(
        r: Region, guards: Sequence[Guard], kinds: dict[int, str], model: str, file: str
    ) -> RegionRecord:
        return RegionRecord(
            r.chain,
            r.first,
            r.last,
            str(r.device),
            tuple(r.inputs),
            tuple(r.scalar_inputs),
            tuple((s.slot, s.how, s.instruction) for s in r.stores),
            tuple((int(a[0]), int(a[1]), int(a[2])) for a in r.aliases),
            tuple(guards),
            tuple(sorted(kinds.items())),
            model,
            file,
        )

    @property
    def span(self) -> tuple[int, int, int]:
        return (self.chain, self.first, self.last)

    def matches(self, r: Region) -> bool:
        """Whether this is the record of region ``r`` as planned now."""
        return self == RegionRecord.of(r, self.guards, dict(self.kinds), self.model, self.file)

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "first": self.first,
            "last": self.last,
            "device": self.device,
            "inputs": list(self.inputs),
            "scalar_inputs": list(self.scalar_inputs),
            "stores": [list(s) for s in self.stores],
            "aliases": [list(a) for a in self.aliases],
            "guards": [g.to_json() for g in self.guards],
            "kinds": [list(k) for k in self.kinds],
            "model": self.model,
            "file": self.file,
        }


@dataclass(frozen=True)
class FailedRecord:
    """A region that did not trace, and why (it runs interpreted)."""

    chain: int
    first: int
    last: int
    reason: str

    @property
    def span(self) -> tuple[int, int, int]:
        return (self.chain, self.first, self.last)

    def to_json(self) -> dict[str, Any]:
        return {"chain": self.chain, "first": self.first, "last": self.last, "reason": self.reason}


@dataclass(frozen=True)
class Manifest:
    method: str
    regions: tuple[RegionRecord, ...]
    failed: tuple[FailedRecord, ...]
    compile_seconds: float
    files: tuple[tuple[str, FileRecord], ...] = ()

    def to_json(self, layout: int) -> dict[str, Any]:
        return {
            "layout": layout,
            "method": self.method,
            "regions": [r.to_json() for r in self.regions],
            "failed": [f.to_json() for f in self.failed],
            "compile_seconds": self.compile_seconds,
            "files": {n: {"size": f.size, "sha256": f.sha256} for n, f in self.files},
        }


# ---- reading --------------------------------------------------------------------------


def _fail(where: str, what: str) -> CacheEntryError:
    return CacheEntryError(f"manifest {where}: {what}")


def _obj(data: Any, where: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _fail(where, f"must be an object, not {type(data).__name__}")
    if set(data) != keys:
        missing, extra = sorted(keys - set(data)), sorted(set(data) - keys)
        raise _fail(where, f"missing keys {missing}, unexpected keys {extra}")
    return data


def _int(data: Any, where: str) -> int:
    if type(data) is not int or data < 0:
        raise _fail(where, f"must be a non-negative int, not {data!r:.40}")
    return data


def _str(data: Any, where: str) -> str:
    if not isinstance(data, str):
        raise _fail(where, f"must be a string, not {type(data).__name__}")
    return data


def _list(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise _fail(where, f"must be a list, not {type(data).__name__}")
    return data


def _ints(data: Any, where: str, width: int | None = None) -> tuple[int, ...]:
    items = _list(data, where)
    if width is not None and len(items) != width:
        raise _fail(where, f"must have {width} items, not {len(items)}")
    return tuple(_int(x, f"{where}[{i}]") for i, x in enumerate(items))


_REGION_KEYS = {
    "chain",
    "first",
    "last",
    "device",
    "inputs",
    "scalar_inputs",
    "stores",
    "aliases",
    "guards",
    "kinds",
    "model",
    "file",
}


def _region(data: Any, where: str) -> RegionRecord:
    d = _obj(data, where, _REGION_KEYS)
    device = _str(d["device"], f"{where}.device")
    if not _DEVICE.fullmatch(device):
        raise _fail(f"{where}.device", f"not a device: {device!r:.40}")
    stores = []
    for i, s in enumerate(_list(d["stores"], f"{where}.stores")):
        w = f"{where}.stores[{i}]"
        items = _list(s, w)
        if len(items) != 3 or items[1] not in STORE_HOWS:
            raise _fail(w, f"must be [slot, one of {', '.join(STORE_HOWS)}, instruction]")
        stores.append((_int(items[0], w), str(items[1]), _int(items[2], w)))
    aliases = [
        _ints(a, f"{where}.aliases[{i}]", 3) for i, a in enumerate(_list(d["aliases"], where))
    ]
    guards = []
    for i, g in enumerate(_list(d["guards"], f"{where}.guards")):
        try:
            guards.append(Guard.from_json(g))
        except GuardError as e:
            raise _fail(f"{where}.guards[{i}]", str(e)) from None
    kinds = []
    returned = {s[0] for s in stores}
    for i, pair in enumerate(_list(d["kinds"], f"{where}.kinds")):
        w = f"{where}.kinds[{i}]"
        items = _list(pair, w)
        if len(items) != 2 or items[1] not in SCALAR_KINDS:
            raise _fail(w, f"must be [slot, one of {', '.join(SCALAR_KINDS)}]")
        slot = _int(items[0], w)
        if slot not in returned:
            raise _fail(w, f"value {slot} is not one the region stores")
        kinds.append((slot, str(items[1])))
    model = _str(d["model"], f"{where}.model")
    if not _MODEL.fullmatch(model):
        raise _fail(f"{where}.model", f"not a model name: {model!r:.40}")
    file = d["file"]
    if not valid_name(file):
        raise _fail(f"{where}.file", f"must be a bare file name, not {file!r:.80}")
    return RegionRecord(
        _int(d["chain"], f"{where}.chain"),
        _int(d["first"], f"{where}.first"),
        _int(d["last"], f"{where}.last"),
        device,
        _ints(d["inputs"], f"{where}.inputs"),
        _ints(d["scalar_inputs"], f"{where}.scalar_inputs"),
        tuple(stores),
        tuple((a[0], a[1], a[2]) for a in aliases),
        tuple(guards),
        tuple(kinds),
        model,
        file,
    )


def _failed(data: Any, where: str) -> FailedRecord:
    d = _obj(data, where, {"chain", "first", "last", "reason"})
    return FailedRecord(
        _int(d["chain"], f"{where}.chain"),
        _int(d["first"], f"{where}.first"),
        _int(d["last"], f"{where}.last"),
        _str(d["reason"], f"{where}.reason")[:1000],
    )


def _files(data: Any) -> tuple[tuple[str, FileRecord], ...]:
    if not isinstance(data, dict):
        raise _fail("files", f"must be an object, not {type(data).__name__}")
    out = []
    for name, rec in data.items():
        where = f"files[{name!r:.80}]"
        if not valid_name(name):
            raise _fail(where, "must be a bare file name")
        d = _obj(rec, where, {"size", "sha256"})
        digest = _str(d["sha256"], f"{where}.sha256")
        if not _SHA256.fullmatch(digest):
            raise _fail(f"{where}.sha256", "must be 64 lowercase hex digits")
        out.append((name, FileRecord(_int(d["size"], f"{where}.size"), digest)))
    return tuple(sorted(out))


def parse(data: Any, layout: int) -> Manifest:
    """The manifest ``data`` (parsed JSON) describes (module docstring)."""
    d = _obj(data, "", {"layout", "method", "regions", "failed", "compile_seconds", "files"})
    if type(d["layout"]) is not int or d["layout"] != layout:
        raise _fail("layout", f"is {d['layout']!r:.20}, this ptexec reads {layout}")
    seconds = d["compile_seconds"]
    if type(seconds) not in (int, float) or not 0 <= seconds < 1e9:
        raise _fail("compile_seconds", f"must be a number of seconds, not {seconds!r:.40}")
    regions = tuple(
        _region(r, f"regions[{i}]") for i, r in enumerate(_list(d["regions"], "regions"))
    )
    failed = tuple(_failed(f, f"failed[{i}]") for i, f in enumerate(_list(d["failed"], "failed")))
    files = _files(d["files"])
    names = {n for n, _ in files}
    for i, r in enumerate(regions):
        if r.file not in names:
            raise _fail(f"regions[{i}].file", f"{r.file!r} is not one of the entry's files")
    return Manifest(_str(d["method"], "method"), regions, failed, float(seconds), files)
