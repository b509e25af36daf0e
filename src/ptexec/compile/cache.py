"""The on-disk cache of compiled methods: one directory per key, written atomically.

The key digests everything the compiled code depends on: the program's bytes (and its
external data file's), the method, the device (with the CPU's instruction set, or the
GPU's compute capability: the code is built for this machine), the compile options, and
the versions of torch, Python, ptexec (its version and a digest of its sources) and this
cache's layout. An entry is a directory holding the
compiled regions (a shared library per CPU region, one package of the CUDA ones) and
``manifest.json`` (the regions, their guards, their files, what fell back and why). It is assembled in a temporary directory next to its
final place and renamed there in one step, so a reader sees a complete entry or none,
and two processes compiling the same key cannot corrupt it (the second rename loses and
its copy is dropped).

The directory is ``PTEXEC_CACHE_DIR`` when set, else ``ptexec`` under the user's cache
directory (``XDG_CACHE_HOME`` or ``~/.cache``; ``~/Library/Caches`` on macOS,
``LOCALAPPDATA`` on Windows).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["CacheEntry", "cache_dir", "cache_key"]

LAYOUT_VERSION = 1  # bump when what is stored, or how it is read, changes
MANIFEST = "manifest.json"


def cache_dir() -> Path:
    """Where compiled methods are kept (module docstring)."""
    env = os.environ.get("PTEXEC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ptexec"


def _machine(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda sm_{major}{minor} cuda {torch.version.cuda}"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{platform.machine()} {capability}"


@functools.cache
def _source_digest() -> str:
    """A digest of ptexec's own Python sources: what traces a program (the kernels' and the
    delegates' torch code, the rebuild) is part of what the compiled code depends on, and a
    changed ptexec must not read an entry an older one wrote (even at the same version)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(
    blobs: Iterable[memoryview | bytes],
    method: str,
    device: str,
    options: Mapping[str, Any],
) -> str:
    """The key of a compiled method (module docstring)."""
    import torch

    from .. import __version__

    h = hashlib.sha256()
    for blob in blobs:
        h.update(len(blob).to_bytes(8, "little"))
        h.update(blob)
    meta = {
        "method": method,
        "device": device,
        "machine": _machine(device),
        "options": dict(options),
        "torch": torch.__version__,
        "ptexec": __version__,
        "sources": _source_digest(),
        "layout": LAYOUT_VERSION,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


class CacheEntry:
    """The entry of one key under ``root``."""

    def __init__(self, root: Path, key: str) -> None:
        self.root = root
        self.key = key
        self.path = root / key

    def read(self) -> dict[str, Any] | None:
        """The manifest of a complete entry, or None (absent, or not readable as one)."""
        try:
            with open(self.path / MANIFEST, encoding="utf-8") as f:
                manifest: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            return None
        if manifest.get("layout") != LAYOUT_VERSION:
            return None
        try:
            if not all((self.path / r["file"]).is_file() for r in manifest.get("regions", [])):
                return None  # a model file is missing: not an entry to load
        except (KeyError, TypeError):
            return None
        return manifest

    def staging(self) -> Path:
        """A fresh directory to assemble the entry in, next to its final place."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(
            tempfile.mkdtemp(prefix=f".{self.key[:16]}-{uuid.uuid4().hex[:8]}-", dir=self.root)
        )

    def commit(self, staging: Path, manifest: dict[str, Any]) -> bool:
        """Write the manifest into ``staging`` and move it to its place in one rename;
        False when another process got there first (its entry is kept, ours dropped)."""
        manifest = {**manifest, "layout": LAYOUT_VERSION}
        with open(staging / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(staging, self.path)
            return True
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            return False

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)
