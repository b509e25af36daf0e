"""Generated Python: compiled once, shown in tracebacks, forgotten with its owner.

ptexec turns a program's instructions (and a delegate's graph) into Python source at load.
Everything that does so compiles through :class:`Sources`: each piece gets a unique file
name (so a traceback names the method, the chain and the block), is registered with
:mod:`linecache` (so the traceback shows the generated line), and keeps a map from its
lines to the instructions they run (so a failure names its instruction). When the owner of
a :class:`Sources` is freed, its entries leave :mod:`linecache`: loading and freeing
methods in a loop leaves nothing behind. A :class:`Template` (one function for many
owners, each with a namespace of its own) keeps its one entry while it lives, in its
user's bounded cache.

Generators write their source with :class:`Code`: lines appended one by one, each
optionally tagged with the instruction it runs, rendered into the text and the line map
that :meth:`Sources.compile` takes. A :class:`Sources` keeps each piece's text, so the code
a method runs can be shown (:meth:`Sources.piece`, :meth:`Piece.listing`).

Compiling the text is a large part of loading a method, and the same text comes back
often (a program loaded again, methods of the same shape, one block repeated): compiled
code objects are kept in a bounded in-process cache keyed by the text (at most
:data:`COMPILED_TEXTS` texts, :data:`COMPILED_CHARS` characters in all, least recently
used first out). The text is generated here, never read from disk, and a hit gives the
code object that compiling the same text gives, renamed to the piece's own file name.
Long texts' code objects are also kept on disk for later processes
(:mod:`ptexec.codestore`, under the compiled methods' trust rules).
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import linecache
import re
import types
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import codestore
from .format.lru import Lru

__all__ = ["Code", "Piece", "Sources", "Template"]

_NAMES = itertools.count()

COMPILED_TEXTS = 4096  # generated texts whose code objects are kept
COMPILED_CHARS = 16 << 20  # their total length
# where the code objects nested in a code object are: (position in its constants, what
# is nested in that one), for each
_Nested = tuple[tuple[int, "_Nested"], ...]


class _Compiled(NamedTuple):
    """A text compiled: its code object, its lines as linecache holds them (read only,
    shared), where its nested code objects are, and every name they may look up as a
    global (the functions the text defines read no other)."""

    code: types.CodeType
    lines: list[str]
    nested: _Nested
    names: frozenset[str]


# text -> what compiling it gave
_compiled: Lru[_Compiled] = Lru(COMPILED_TEXTS, COMPILED_CHARS)
_PLACEHOLDER = "<ptexec generated>"


def _nested(code: types.CodeType) -> _Nested:
    return tuple(
        (k, _nested(c)) for k, c in enumerate(code.co_consts) if isinstance(c, types.CodeType)
    )


def _inner_names(code: types.CodeType, nested: _Nested) -> frozenset[str]:
    """The names every code object nested in ``code`` may look up as globals."""
    names: set[str] = set()
    for k, inner in nested:
        c = code.co_consts[k]
        names.update(c.co_names)
        names.update(_inner_names(c, inner))
    return frozenset(names)


def _renamed(code: types.CodeType, filename: str, nested: _Nested) -> types.CodeType:
    """``code`` and every code object nested in it (where ``nested`` says), with file name
    ``filename``."""
    if not nested:
        return code.replace(co_filename=filename)
    consts = list(code.co_consts)
    for k, inner in nested:
        consts[k] = _renamed(consts[k], filename, inner)
    return code.replace(co_filename=filename, co_consts=tuple(consts))


def _compile(source: str, filename: str) -> tuple[types.CodeType, _Compiled]:
    """``compile(source, filename, "exec")`` through the cache (module docstring), and
    what the cache holds of it."""
    hit = _cached(source)
    return _renamed(hit.code, filename, hit.nested), hit


def _cached(source: str) -> _Compiled:
    """``source`` compiled (under a placeholder file name) and its lines, through the
    cache."""
    hit = _compiled.get(source)
    if hit is None:
        code = codestore.load(source)  # compiled by an earlier process (long texts only)
        if code is None:
            code = compile(source, _PLACEHOLDER, "exec")
            codestore.store(source, code)
        nested = _nested(code)
        hit = _Compiled(code, source.splitlines(True), nested, _inner_names(code, nested))
        if len(source) <= COMPILED_CHARS // 4:
            _compiled.put(source, hit, len(source))
    return hit


def _forget(filenames: list[str]) -> None:
    for name in filenames:
        linecache.cache.pop(name, None)


class Code:
    """Python source being written: lines appended in order, each optionally tagged with
    the instruction (of one chain) it runs, and the names the source uses (``env``).

    ``add(text, at)`` appends every line of ``text`` at the current indentation, tagged
    with instruction ``at`` (None: not an instruction's line); ``with code.indented():``
    indents what is added inside it. :meth:`compile` compiles the text through
    :class:`Sources` with its line map, so a failure on a tagged line names that
    instruction."""

    def __init__(self, chain: int = 0) -> None:
        self.chain = chain
        self.env: dict[str, Any] = {}
        self._lines: list[str] = []
        self._tags: dict[int, int] = {}
        self._pad = ""

    def add(self, text: str, at: int | None = None) -> None:
        """Append each line of ``text`` (nothing for an empty text)."""
        if text and text.isprintable():  # one line (most are): no line break of any kind
            self._lines.append(self._pad + text)
            if at is not None:
                self._tags[len(self._lines)] = at
            return
        for part in text.splitlines():
            self._lines.append(self._pad + part)
            if at is not None:
                self._tags[len(self._lines)] = at

    @contextlib.contextmanager
    def indented(self) -> Iterator[None]:
        """Indent what is added in the ``with`` block by one level."""
        pad = self._pad
        self._pad = pad + "    "
        try:
            yield
        finally:
            self._pad = pad

    @property
    def text(self) -> str:
        return "\n".join(self._lines) + "\n"

    @property
    def line_map(self) -> dict[int, int]:
        """1-based line -> the instruction it runs."""
        return dict(self._tags)

    def compile(self, sources: Sources, what: str) -> dict[str, Any]:
        """Compile and run the text in a namespace made from :attr:`env`; return it."""
        return sources.compile(self.text, what, self.env, chain=self.chain, lines=self._tags)

    def function(self, sources: Sources, what: str, name: str) -> Any:
        """Compile and run the text as :meth:`compile` does; return its function ``name``
        (see :meth:`Sources.function`)."""
        return sources.function(self.text, what, name, self.env, chain=self.chain, lines=self._tags)


@dataclass(frozen=True, slots=True)
class Piece:
    """One compiled piece of generated code: what it is, its text, the chain its tagged
    lines belong to and its line map."""

    what: str
    text: str
    chain: int
    lines: Mapping[int, int]

    def listing(self, names: Sequence[str] = ()) -> str:
        """The text with a comment before each run of lines of one instruction
        (``# instruction 3: aten::add.out``, the name from ``names`` when it has one);
        it compiles as the text does."""
        out: list[str] = []
        last = None
        for n, line in enumerate(self.text.splitlines(), 1):
            at = self.lines.get(n)
            if at is not None and at != last:
                pad = line[: len(line) - len(line.lstrip())]
                name = f": {names[at]}" if 0 <= at < len(names) else ""
                out.append(f"{pad}# instruction {at}{name}")
            last = at
            out.append(line)
        return "\n".join(out) + "\n"


class Sources:
    """The generated code of one owner (a loaded method, a delegate runner).

    ``label`` names the owner in every file name (a NUL byte, which :func:`compile` refuses
    in a file name, is escaped). :meth:`compile` returns the namespace the source defined;
    :meth:`locate` maps a traceback back to the ``(chain, instruction)`` whose line failed.
    """

    def __init__(self, label: str) -> None:
        self.label = label.replace("\0", "\\x00")
        self._files: list[str] = []
        self._lines: dict[str, tuple[int, Mapping[int, int]]] = {}
        self._pieces: dict[str, Piece] = {}
        self._finalizer = weakref.finalize(self, _forget, self._files)

    def compile(
        self,
        source: str,
        what: str,
        env: Mapping[str, Any] | None = None,
        *,
        chain: int = 0,
        lines: Mapping[int, int] | None = None,
    ) -> dict[str, Any]:
        """Compile and run ``source`` in a namespace made from ``env``; return it.

        ``what`` says which piece it is (``"chain 0 block 2"``); ``lines`` maps a 1-based
        line of ``source`` to the instruction of ``chain`` it runs."""
        return self._run(source, what, env, chain, lines)[0]

    def _run(
        self,
        source: str,
        what: str,
        env: Mapping[str, Any] | None,
        chain: int,
        lines: Mapping[int, int] | None,
    ) -> tuple[dict[str, Any], frozenset[str]]:
        """:meth:`compile`'s namespace, and the names the functions it defined may look up
        as globals."""
        filename = f"<ptexec #{next(_NAMES)} {self.label} {what}>"
        code, compiled = _compile(source, filename)
        namespace: dict[str, Any] = dict(env or {})
        namespace["__ptexec_sources__"] = self  # the code keeps its sources registered
        exec(code, namespace)
        linecache.cache[filename] = (len(source), None, compiled.lines, filename)
        self._files.append(filename)
        if lines:
            self._lines[filename] = (chain, lines)
        self._pieces[filename] = Piece(what, source, chain, dict(lines or {}))
        return namespace, compiled.names

    def function(
        self,
        source: str,
        what: str,
        name: str,
        env: Mapping[str, Any] | None = None,
        *,
        chain: int = 0,
        lines: Mapping[int, int] | None = None,
    ) -> Any:
        """The function ``name`` that ``source`` defines (compiled as :meth:`compile`
        does). Its globals no longer hold it when its code never reads ``name`` as a
        global: a function and the namespace holding it are a reference cycle, which
        only Python's cyclic collector frees, so the owner of the function (and all it
        holds: tensors, ExecuTorch's methods) would outlive the last reference to it."""
        namespace, names = self._run(source, what, env, chain, lines)
        fn = namespace[name]
        if name not in names:  # (the functions defined are the code nested in the text's)
            del namespace[name]
        return fn

    def piece(self, fn: Any) -> Piece | None:
        """The piece that defined function ``fn`` (None when this owner did not)."""
        code = getattr(fn, "__code__", None)
        return None if code is None else self._pieces.get(code.co_filename)

    def listing(self, fn: Any, names: Sequence[str] = ()) -> str:
        """The source of the generated function ``fn``, instructions named
        (:meth:`Piece.listing`); a comment saying so when this owner did not generate it."""
        piece = self.piece(fn)
        if piece is None:
            return f"# {getattr(fn, '__qualname__', type(fn).__name__)}: not generated code\n"
        return piece.listing(names)

    def locate(self, tb: types.TracebackType | None) -> tuple[int, int] | None:
        """The innermost ``(chain, instruction)`` of this owner's code in traceback ``tb``."""
        found = None
        while tb is not None:
            where = self._lines.get(tb.tb_frame.f_code.co_filename)
            if where is not None:
                index = where[1].get(tb.tb_lineno)
                if index is not None:
                    found = (where[0], index)
            tb = tb.tb_next
        return found

    @property
    def filenames(self) -> tuple[str, ...]:
        return tuple(self._files)

    def close(self) -> None:
        """Forget every source now (also done when this object is freed)."""
        self._finalizer()


class Template:
    """The function ``name`` that ``source`` defines (at its top level, with no defaults),
    compiled once for owners that each run it in a namespace of their own (a delegate
    runner keeps its state in its globals): one file name, in :mod:`linecache` while the
    template lives. :meth:`function` makes the function for one namespace without running
    the text, where a piece of a :class:`Sources` costs a file name, a code object renamed
    and a text run per owner."""

    def __init__(self, source: str, what: str, name: str) -> None:
        filename = f"<ptexec #{next(_NAMES)} {what}>"
        code, compiled = _compile(source, filename)
        found = [c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == name]
        if len(found) != 1:
            raise ValueError(f"the text defines {len(found)} functions named {name!r}, not 1")
        self.code = found[0]
        self.name = name
        linecache.cache[filename] = (len(source), None, compiled.lines, filename)
        self._finalizer = weakref.finalize(self, _forget, [filename])

    def function(self, namespace: dict[str, Any]) -> types.FunctionType:
        """The function, its globals ``namespace`` (given the builtins, as running a text
        in it would)."""
        namespace.setdefault("__builtins__", builtins)
        return types.FunctionType(self.code, namespace, self.name)


# a value table slot ``v[12]`` outside a string (run_once templates only sources without
# quotes): the slot numbers become names, so that work of one shape on other slots (the
# same view of each layer's weight, say) compiles once
_SLOT = re.compile(r"(?<![\w.\]])v\[(\d+)\]")
_SLOT_NAME = "__ptexec_slot{}"
# source -> (the code of its template, the slot number each name of it stands for)
_templates: Lru[tuple[types.CodeType, tuple[tuple[str, int], ...]]] = Lru(COMPILED_TEXTS, 0)


def _template(source: str) -> tuple[types.CodeType, tuple[tuple[str, int], ...]]:
    hit = _templates.get(source)
    if hit is not None:
        return hit
    slots: dict[str, str] = {}

    def name(m: re.Match[str]) -> str:
        number = m.group(1)
        found = slots.get(number)
        if found is None:
            found = slots[number] = _SLOT_NAME.format(len(slots))
        return f"v[{found}]"

    text = source
    if "'" not in source and '"' not in source and _SLOT_NAME[:-2] not in source:
        text = _SLOT.sub(name, source)
    hit = (_cached(text).code, tuple((n, int(k)) for k, n in slots.items()))
    _templates.put(source, hit)
    return hit


def run_once(source: str, namespace: dict[str, Any]) -> None:
    """Run ``source`` once, now, in ``namespace`` (which it may change: work done at load whose
    failure the caller catches and handles itself, so no traceback ever shows it): the
    compiled code comes from the cache, without a file name or a :class:`Sources` entry
    of its own. Sources that differ only in the slots of ``v`` they use share one
    compiled template, its slot numbers given as names in ``namespace``."""
    code, slots = _template(source)
    for n, k in slots:
        namespace[n] = k
    exec(code, namespace)


def clear_compiled() -> None:
    """Forget every cached code object (see the module docstring)."""
    _compiled.clear()
    _templates.clear()
