"""A prepared graph (:class:`XnnRunner`) and its variant timed per node."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["XnnRunner", "timed_source"]


class XnnRunner:
    """A prepared XNNPACK graph: ``runner(*tensors)`` runs it on the delegate's tensors
    (in external-id order, inputs and outputs together) and writes the outputs in place.
    :meth:`run_nodes` runs the same statements and reports each node's time."""

    def __init__(
        self,
        fn: Callable[..., None],
        source: str,
        ext_ids: tuple[int, ...],
        node_types: dict[str, int],
        output_ids: tuple[int, ...] = (),
        timed: Callable[[], Callable[..., None]] | None = None,
    ) -> None:
        self.fn = fn
        self.source = source
        self.ext_ids = ext_ids  # the delegate call arguments it takes, in order
        self.output_ids = output_ids  # those of them it writes
        self.node_types = node_types
        self._make_timed = timed
        self._timed: Callable[..., None] | None = None

    def run_nodes(self, report: Callable[[str, int, int], None], *tensors: torch.Tensor) -> None:
        """Run the graph as ``runner(*tensors)`` does, the same statements, calling
        ``report(name, start, end)`` after each node (``FullyConnected #1``; a region of
        int8 elementwise nodes run as one table lookup is one ``Lookup table (...)``).
        The timed variant is generated on first use."""
        fn = self._timed
        if fn is None:
            if self._make_timed is None:
                self.fn(*tensors)
                return
            fn = self._timed = self._make_timed()
        fn(report, *tensors)

    def __call__(self, *tensors: torch.Tensor) -> None:
        self.fn(*tensors)

    def __repr__(self) -> str:
        return f"XnnRunner({sum(self.node_types.values())} nodes, externals {list(self.ext_ids)})"


def timed_source(lines: Sequence[str], spans: Sequence[tuple[str, int, int]], params: str) -> str:
    """The graph's statements again, each node's between two clock readings and followed
    by ``_report(name, start, end)``; statements outside nodes (inputs, outputs) as they
    are. A name (made of ptexec's own node type names) enters the code as its repr."""
    out = [f"def _xnnpack_nodes(_report, {params}):" if params else "def _xnnpack_nodes(_report):"]
    at = 0
    for name, first, last in spans:
        out += [f"    {line}" for line in lines[at:first]]
        if first == last:  # a node that made no statement of its own (an alias)
            out += ["    _t0 = _now()", f"    _report({name!r}, _t0, _t0)"]
        else:
            out.append("    _t0 = _now()")
            out += [f"    {line}" for line in lines[first:last]]
            out.append(f"    _report({name!r}, _t0, _now())")
        at = last
    out += [f"    {line}" for line in lines[at:]]
    if len(out) == 1:
        out.append("    pass")
    return "\n".join(out) + "\n"
