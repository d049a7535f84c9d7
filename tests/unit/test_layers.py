"""The package's layers, read from the source with ``ast`` (nothing is imported).

core (settings, errors, shared types) imports no other part of the package; the engine and the
request side each import only core and themselves; the parts (web/, ops/, ...) import each
other in no circle; no module-level import cycles; an import inside a function says why on its
line or the line above (one comment may head a run of such imports).
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HANDLER = Path(__file__).resolve().parents[2] / "handler"
PACKAGE = "hymt_serve"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a package's __init__ for a name taken from it)
    where: str  # file:line
    line: int
    end_line: int
    in_function: bool
    type_checking: bool  # under ``if TYPE_CHECKING:``: never run


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(HANDLER).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_files() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((HANDLER / PACKAGE).rglob("*.py"))}


MODULES = _package_files()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name ``from`` imports from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(
    node: ast.AST, in_function: bool = False, type_checking: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function, type_checking
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _walk(child, True, type_checking)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield from _walk(ast.Module(body=[statement], type_ignores=[]), in_function, True)
            for statement in child.orelse:
                yield from _walk(ast.Module(body=[statement], type_ignores=[]), in_function)
        else:
            yield from _walk(child, in_function, type_checking)


def _imports(path: Path, module: str) -> Iterator[Import]:
    """Every import of ``path``, targets in the package resolved to a module of it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    where = f"{path.relative_to(HANDLER.parent)}"
    for node, in_function, type_checking in _walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _resolve(module, is_package, node)
            # ``from package import submodule`` imports that submodule.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        for target in dict.fromkeys(targets):
            yield Import(
                module,
                target,
                f"{where}:{node.lineno}",
                node.lineno,
                node.end_lineno or node.lineno,
                in_function,
                type_checking,
            )


def _all_imports() -> list[Import]:
    return [found for module, path in MODULES.items() for found in _imports(path, module)]


IMPORTS = _all_imports()


def _layer(module: str) -> str | None:
    """The package's part a module belongs to (``core``, ``engine``, ...); None outside it."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 else PACKAGE


def _offenders(layer: str, allowed: set[str]) -> list[str]:
    return [
        f"{found.where}: {found.source} imports {found.target}"
        for found in IMPORTS
        if _layer(found.source) == layer
        and (target_layer := _layer(found.target)) is not None
        and target_layer not in allowed
    ]


def test_the_modules_are_found() -> None:
    """The walk sees the package's parts, so the rules below cannot pass on nothing."""
    layers = {_layer(module) for module in MODULES}
    assert {"core", "engine", "request", "web", "ops"} <= layers
    assert any(found.target == "hymt_serve.core.settings" for found in IMPORTS)


def test_the_package_root_imports_nothing_of_its_own() -> None:
    """Every part may import ``hymt_serve`` itself (its version) only because it imports none."""
    assert _offenders(PACKAGE, set()) == []


def test_core_imports_only_core() -> None:
    offenders = _offenders("core", {"core", PACKAGE})
    assert not offenders, "core must import nothing else of hymt_serve:\n" + "\n".join(offenders)


def test_the_engine_imports_only_core_and_itself() -> None:
    offenders = _offenders("engine", {"core", "engine", PACKAGE})
    assert not offenders, "the engine imports outside core and engine:\n" + "\n".join(offenders)


def test_the_request_side_imports_only_core_and_itself() -> None:
    offenders = _offenders("request", {"core", "request", PACKAGE})
    assert not offenders, "request/ imports outside core and request:\n" + "\n".join(offenders)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, or with an edge to itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(edges):
        if root in index:
            continue
        visit(root)
        work = [(root, iter(sorted(edges[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    visit(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    found.append(sorted(component))
    return found


def test_cycles_are_found() -> None:
    """The cycle finder itself, on a graph with one circle and one chain."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(_cycles(edges)) == [["a", "b", "c"], ["e"]]


def test_the_parts_import_each_other_in_no_circle() -> None:
    """web/ and ops/ (or any parts) use one another one way only, imports inside functions
    included: the command line may start the front end, never the other way too."""
    uses: dict[tuple[str, str], list[str]] = {}
    for found in IMPORTS:
        source, target = _layer(found.source), _layer(found.target)
        if source is None or target is None or PACKAGE in (source, target) or source == target:
            continue
        uses.setdefault((source, target), []).append(
            f"{found.where}: {found.source} imports {found.target}"
        )
    edges: dict[str, set[str]] = {}
    for source, target in uses:
        edges.setdefault(source, set()).add(target)
        edges.setdefault(target, set())
    circles = _cycles(edges)
    report = [
        line
        for circle in circles
        for line in (
            " <-> ".join(circle),
            *(
                use
                for (source, target), lines in sorted(uses.items())
                if source in circle and target in circle
                for use in lines
            ),
        )
    ]
    assert not circles, "parts that import each other in a circle:\n" + "\n".join(report)


def test_no_module_level_import_cycles() -> None:
    edges: dict[str, set[str]] = {module: set() for module in MODULES}
    lines: dict[tuple[str, str], str] = {}
    for found in IMPORTS:
        if found.in_function or found.type_checking or found.target not in MODULES:
            continue
        edges[found.source].add(found.target)
        lines.setdefault((found.source, found.target), found.where)
    cycles = _cycles(edges)
    report = []
    for cycle in cycles:
        members = set(cycle)
        report.append(" <-> ".join(cycle))
        report += [
            f"    {where}: {source} imports {target}"
            for (source, target), where in sorted(lines.items())
            if source in members and target in members
        ]
    assert not cycles, "module-level import cycles:\n" + "\n".join(report)


def _comment_lines(path: Path) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return {token.start[0] for token in tokens if token.type == tokenize.COMMENT}


def test_imports_inside_functions_say_why() -> None:
    """A comment on the import's lines or the line above (optional dependency, start-up cost,
    a circle broken on purpose, ...); imports that directly follow such an import share it."""
    paths = {module: path for module, path in MODULES.items()}
    for path in sorted(HANDLER.glob("*.py")):
        paths[_module_name(path)] = path
    silent = []
    for module, path in sorted(paths.items()):
        comments = _comment_lines(path)
        inner: dict[tuple[int, int], list[str]] = {}
        for found in _imports(path, module):
            if found.in_function:
                inner.setdefault((found.line, found.end_line), []).append(found.target)
        explained_until = -1  # the last line of the run of explained imports
        for (line, end_line), targets in sorted(inner.items()):
            if comments & set(range(line - 1, end_line + 1)) or explained_until == line - 1:
                explained_until = end_line
            else:
                silent.append(f"{path.relative_to(HANDLER.parent)}:{line}: {', '.join(targets)}")
    assert not silent, "imports inside functions without a reason beside them:\n" + "\n".join(
        silent
    )
