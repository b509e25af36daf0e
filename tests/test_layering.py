"""The layering docs/architecture.md draws, checked on the source: no import cycle among
ptexec's modules (imports inside functions count; ``if TYPE_CHECKING:`` imports do not run
and do not), and the format layer reaches neither torch nor the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "ptexec"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(f): f for f in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: module level and inside functions and classes,
    but not under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The modules ``node`` in module ``name`` imports (external ones by their full name)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base_parts = package[: len(package) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.add(sub if sub in known else base)
    return out


def _packages(target: str) -> list[str]:
    """The packages Python imports before ``target`` (``a.b.c``: ``a``, ``a.b``)."""
    parts = target.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports at run time (ptexec's and external ones).

    Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so those are
    imported too, except the packages the importer itself is in (they are already being
    imported when its code runs)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        own = {name, *_packages(name)}
        edges: set[str] = set()
        for node in _runtime_imports(tree):
            for target in _targets(name, path, node, known):
                edges.add(target)
                edges.update(pkg for pkg in _packages(target) if pkg in known and pkg not in own)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _path(graph: dict[str, set[str]], members: set[str]) -> str:
    """One cycle through ``members``, written out, for the failure message."""
    start = min(members)
    trail = [start]
    seen = {start}
    while True:
        nxt = sorted(w for w in graph[trail[-1]] if w in members)
        back = [w for w in nxt if w == start]
        if back and len(trail) > 1:
            return " -> ".join([*trail, start])
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            return " -> ".join([*trail, nxt[0]]) if nxt else " -> ".join(trail)
        trail.append(fresh[0])
        seen.add(fresh[0])


def test_graph_sees_function_level_and_relative_imports() -> None:
    graph = import_graph()
    assert len(graph) > 50
    assert "ptexec.format.program" in graph["ptexec.format.decode"]  # from . import program
    assert "ptexec.errors" in graph["ptexec.format.decode"]  # from ..errors import ...
    tree = ast.parse("def f():\n    from .x import y\nif TYPE_CHECKING:\n    import z\n")
    imports = _runtime_imports(tree)
    assert [type(i).__name__ for i in imports] == ["ImportFrom"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    graph = {k: {w for w in v if w.startswith("ptexec")} for k, v in import_graph().items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles among ptexec's modules:\n" + "\n".join(
        _path(graph, set(c)) for c in cycles
    )


def test_format_layer_reaches_no_torch_and_no_runtime() -> None:
    graph = import_graph()
    allowed = {"ptexec.errors"}  # the one error hierarchy, itself torch-free (checked below)
    bad = []
    todo = [m for m in graph if m == "ptexec.format" or m.startswith("ptexec.format.")]
    seen = set(todo)
    while todo:
        m = todo.pop()
        for w in sorted(graph[m]):
            if w == "torch" or w.startswith("torch."):
                bad.append(f"{m} imports {w}")
            elif w.startswith("ptexec"):
                if not (w.startswith("ptexec.format") or w in allowed):
                    bad.append(f"{m} imports {w}")
                elif w not in seen:
                    seen.add(w)
                    todo.append(w)
    assert not bad, "the format layer imports torch or the runtime:\n" + "\n".join(bad)


# package -> the packages it must not import: the layers docs/architecture.md draws, from
# the bottom (kernels, delegates and the effects of instructions) through loading and
# running to the compiled tier and the facade
_ABOVE = {
    "ptexec.effects": ("loader", "engine", "compile", "method", "program"),
    "ptexec.kernels": ("loader", "engine", "compile", "method", "program"),
    "ptexec.delegates": ("loader", "engine", "compile", "method", "program"),
    "ptexec.loader": ("engine", "compile", "method", "program"),
    "ptexec.engine": ("compile", "method", "program"),
}


def test_layers_import_downward() -> None:
    graph = import_graph()
    bad = []
    for module, imports in sorted(graph.items()):
        for layer, above in _ABOVE.items():
            if module != layer and not module.startswith(layer + "."):
                continue
            for w in sorted(imports):
                if any(w == f"ptexec.{a}" or w.startswith(f"ptexec.{a}.") for a in above):
                    bad.append(f"{module} imports {w}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_built_in_backends_are_registered_in_one_place() -> None:
    """ptexec's own backends are registered in delegates/__init__.py and nowhere else."""
    modules = _modules()
    known = set(modules)
    calls = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        ours = name.startswith("ptexec.delegates")  # the registry's own package
        for node in _runtime_imports(tree):
            if isinstance(node, ast.ImportFrom) and any(
                a.name == "register_backend" for a in node.names
            ):
                ours |= any(
                    t.startswith("ptexec.delegates") for t in _targets(name, path, node, known)
                )
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ours:
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called == "register_backend":
                    calls.append(name)
    assert set(calls) == {"ptexec.delegates"}, calls

    from ptexec.delegates import describe_payload, registered_backends

    assert "XnnpackBackend" in registered_backends()
    assert describe_payload("NoSuchBackend", memoryview(b"")) is None
