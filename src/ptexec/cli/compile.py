"""``ptexec compile`` (fill the compile cache) and ``ptexec cache`` (list, verify, clear)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import apply_threads, device_map_of, load_program, report_has_warnings, threads_used


def compile_option(args: argparse.Namespace) -> dict[str, Any]:
    if not getattr(args, "compile", False):
        return {}
    from ..compile import CompileOptions

    return {"compile": CompileOptions(progress=None)}


def compiled_report(prog: Any, name: str, device_map: Any) -> Any:
    """Load method ``name`` compiled (from the cache, or compiling it); its report, which
    carries the load's warning."""
    from ..compile import CompileOptions

    with report_has_warnings():
        method = prog.load_method(
            name, device_map=device_map, compile=CompileOptions(progress=None)
        )
    return method.compile_report


def print_compiled(prog: Any, name: str, device_map: Any) -> Any:
    """Load method ``name`` compiled (from the cache, or compiling it) and print the report."""
    report = compiled_report(prog, name, device_map)
    print("  " + report.summary().replace("\n", "\n  "))
    return report


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile every method (or ``--method``) for ``--device``, filling the cache, so that
    ``load_method(..., compile=True)`` later compiles nothing."""
    if args.device and args.device_map:  # (each names the devices; neither is dropped)
        raise ValueError("--device and --device-map both say where to compile: give one")
    apply_threads(args)
    prog = load_program(args)
    device_map = args.device or device_map_of(args)
    names = [args.method] if args.method else list(prog.method_names)
    print(f"compiling {threads_used()}")
    status = 0
    for name in names:
        print(f"method '{name}':")
        report = print_compiled(prog, name, device_map)
        if report.warning and not report.compiled_instructions:
            status = 1
    return status


def cmd_cache(args: argparse.Namespace) -> int:
    """``ptexec cache list|verify|clear``: the compile cache's entries, the generated
    code kept for loads (:mod:`ptexec.codestore`) and the native libraries
    (:mod:`ptexec.libstore`), checked, or removed."""
    from datetime import datetime

    from .. import codestore, libstore
    from ..cachedir import files_under
    from ..compile.aoti import clear_kernels, kept_kernels, kernels_problem
    from ..compile.cache import Cache, cache_dir, foreign_names, max_bytes, root_status
    from ..errors import CacheEntryError

    root = Path(args.dir).expanduser() if args.dir else cache_dir()
    if not root.exists():
        print(f"compile cache {root}: empty (the directory does not exist yet)")
        return 0
    problem, writable = root_status(root)
    if problem is not None:
        print(f"compile cache {root}: not used: {problem}")
        return 1
    cache = Cache(root, writable)
    if args.action == "clear":
        # clearing removes whole directories by name ("code", "native", "inductor"): a
        # directory that holds anything else is not a cache (--dir or PTEXEC_CACHE_DIR
        # naming a project's folder) and nothing in it is removed
        foreign = foreign_names(root)
        if foreign:
            shown = ", ".join(foreign[:5]) + (
                f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
            )
            print(
                f"compile cache {root}: not cleared: it holds what no ptexec cache holds "
                f"({shown}); name the cache's own directory, or remove those first"
            )
            return 1
        removed = cache.clear()
        print(
            f"compile cache {root}: removed {removed} entries, "
            f"{codestore.clear(root)} file(s) of generated code, "
            f"{libstore.clear(root)} native librar(ies) and "
            f"{clear_kernels(root)} file(s) of torch's kernels"
        )
        # the stores remove only the names they write (codestore.makes, libstore.makes):
        # what else their folders hold is named as kept, not as a failure
        makes = {codestore.SUBDIR: codestore.makes, libstore.SUBDIR: libstore.makes}
        kept_names: list[Path] = []
        left: list[Path] = []
        for path in files_under(root):
            parts = path.relative_to(root).parts
            rule = makes.get(parts[0]) if len(parts) > 1 else None
            (kept_names if rule is not None and not rule(parts[1]) else left).append(path)
        if kept_names:
            print(
                f"{len(kept_names)} file(s) kept, not named as ptexec's stores name theirs: "
                f"{_some(root, kept_names)}"
            )
        if not left:
            return 0
        print(
            f"{len(left)} file(s) not removed (this user may not remove them, or a compile "
            f"is writing them now): {_some(root, left)}"
        )
        return 1
    print(f"compile cache {root} ({'writable' if writable else 'read only'})")
    damaged = 0
    total = 0
    entries = cache.entries()
    for entry in entries:
        size = entry.size()
        total += size
        used = datetime.fromtimestamp(entry.last_used()).strftime("%Y-%m-%d %H:%M")
        try:
            manifest = entry.verify()
            what = f"'{manifest.method}', {len(manifest.regions)} region(s)"
        except CacheEntryError as e:
            damaged += 1
            what = f"damaged: {e}"
        print(f"  {entry.key[:16]}  {size / 2**20:9.2f} MiB  used {used}  {what}")
    for path in cache.leftovers():
        print(f"  {path.name}: left by a compile that did not finish")
    cap = max_bytes()
    limit = f"of {cap / 2**30:.1f} GiB (PTEXEC_CACHE_MAX_BYTES)" if cap else "(no size limit)"
    noun = "entry" if len(entries) == 1 else "entries"
    print(f"{len(entries)} {noun}, {total / 2**20:.2f} MiB {limit}; {damaged} damaged")
    code = codestore.files(root)
    for f in code:
        if f.problem is not None:
            name = f.path.name[:16] if f.path.parent.name == codestore.SUBDIR else ""
            print(f"  {codestore.SUBDIR}/{name}  damaged: {f.problem}")
    bad = sum(f.problem is not None for f in code)
    other = sum(f.problem is None and not f.current for f in code)
    state = "" if codestore.enabled() else " (PTEXEC_CODE_CACHE=0: not used)"
    print(
        f"generated code: {len(code)} file(s), {sum(f.size for f in code) / 2**20:.2f} MiB"
        f"{state} ({other} of another Python); {bad} damaged"
    )
    native = libstore.libraries(root)
    for path, problem in native:
        if problem is not None:
            name = path.name[:40] if path.parent.name == libstore.SUBDIR else ""
            print(f"  {libstore.SUBDIR}/{name}  {problem}")
    unfinished = sum(libstore.unfinished(path.name) for path, _ in native)
    broken = sum(problem is not None for _, problem in native) - unfinished
    kept = len(native) - unfinished - broken
    print(f"native libraries: {kept} kept, {broken} damaged, {unfinished} unfinished builds")
    files, size = kept_kernels(root)
    if files:  # (only where torch's own kernel cache was not trusted)
        print(f"torch's kernels compiled here: {files} file(s), {size / 2**20:.2f} MiB")
    kernels = kernels_problem(root)
    if kernels is not None:
        print(f"torch's kernels: not used here: {kernels}")
    failed = damaged or bad or broken or kernels is not None
    return 1 if args.action == "verify" and failed else 0


def _some(root: Path, paths: list[Path]) -> str:
    """The first five of ``paths``, relative to ``root``, and how many more."""
    shown = ", ".join(str(p.relative_to(root)) for p in paths[:5])
    return shown + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
