"""What compiling a method did: :class:`CompileReport` (``Method.compile_report``)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CompileReport", "CompileWarning"]


class CompileWarning(RuntimeWarning):
    """Issued once by a load that compiled less than it tried to (no C++ compiler, a region
    whose compile failed): the method runs, interpreted where it was not compiled."""


@dataclass(frozen=True)
class CompileReport:
    """How a method loaded with ``compile=True`` runs.

    ``compiled_instructions`` of ``total_instructions`` run as compiled code, in
    ``regions`` (``(first, last)`` instruction ranges, inclusive); ``fallbacks`` lists the
    instructions run interpreted as ``(first, last, reason)``; ``compile_seconds`` is the
    time this load spent compiling (0 when the cache had everything); ``cache_hit`` says
    whether the compiled code came from the cache; ``cache_path`` is its entry (None when
    nothing was compiled); ``device`` is the device the code was compiled for; ``warning``
    the one warning loading issued, if any (no C++ compiler, a failing compile);
    ``xnnpack_calls`` the delegate calls inside compiled regions that run with XNNPACK's
    own kernels (ExecuTorch's XNNPACK backend, one opaque call of the compiled code)
    rather than as torch operations, ``native_calls`` how many of them ExecuTorch's C++
    runtime runs without entering Python (:mod:`ptexec.compile.native`; the others go
    through its pybindings; ``native_unavailable`` says why, when none does);
    ``read_in_place`` the method's planned inputs (by
    index) that only compiled code reads, so that a common call passes the caller's
    tensor, when it is dense, rather than copying it into planned memory first (its
    ``last_call`` action is then ``"share"``; :func:`ptexec.compile.regions.caller_readable`)."""

    compiled_instructions: int
    total_instructions: int
    fallbacks: tuple[tuple[int, int, str], ...]
    compile_seconds: float
    cache_hit: bool
    regions: tuple[tuple[int, int], ...] = ()
    device: str = "cpu"
    cache_path: str | None = None
    warning: str | None = None
    chains: tuple[int, ...] = field(default=(), repr=False)  # the chain of each region
    xnnpack_calls: tuple[int, ...] = ()
    read_in_place: tuple[int, ...] = ()
    native_calls: int = 0
    native_unavailable: str | None = None

    @property
    def fully_compiled(self) -> bool:
        return self.compiled_instructions == self.total_instructions

    def summary(self) -> str:
        """A few lines for people (``ptexec inspect --compile``, ``ptexec run --compile``)."""
        lines = [
            f"compiled {self.compiled_instructions} of {self.total_instructions} instructions "
            f"in {len(self.regions)} region(s) for {self.device}"
            + (
                " (from the cache)"
                if self.cache_hit
                else (f", {self.compile_seconds:.1f} s" if self.compile_seconds else "")
            )
        ]
        for first, last in self.regions:
            span = f"{first}-{last}" if last > first else f"{first}"
            inside = [i for i in self.xnnpack_calls if first <= i <= last]
            kernels = f" ({len(inside)} XNNPACK call(s) with XNNPACK's kernels)" if inside else ""
            lines.append(f"  compiled     {span}{kernels}")
        for first, last, reason in self.fallbacks:
            span = f"{first}-{last}" if last > first else f"{first}"
            lines.append(f"  interpreted  {span}: {reason}")
        if self.xnnpack_calls:
            how = (
                f"{self.native_calls} of {len(self.xnnpack_calls)} XNNPACK call(s) run by "
                "ExecuTorch's C++ runtime directly"
            )
            if self.native_unavailable:
                how += f" ({self.native_unavailable})"
            lines.append(f"  {how}")
        if self.read_in_place:
            listed = ", ".join(str(i) for i in self.read_in_place)
            lines.append(f"  input(s) {listed} read in place (no copy into planned memory)")
        if self.warning and any(reason != self.warning for *_, reason in self.fallbacks):
            lines.append(f"  warning: {self.warning}")  # unless every row above says it
        if self.cache_path:
            lines.append(f"  cache: {self.cache_path}")
        return "\n".join(lines)
