"""Layers point down: no module of the package imports, directly or through others, a module that
imports it back, counting imports inside functions too (a lazy import is still a dependency)."""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: package name -> its folder in the repository (pyproject's package-dir: state/ installs as streaming_sink.state)
PACKAGES = {"streaming_sink": ROOT / "streaming_sink", "streaming_sink.state": ROOT / "state"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            name = ".".join((package, *path.relative_to(folder).with_suffix("").parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (a package stands for its __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    # A package's __init__ importing its own submodules is how packages export names: not a layer
    # pointing up, so those edges are left out.
    graph = {name: {t for t in targets if not t.startswith(name + ".")} for name, targets in graph.items()}
    assert cycles(graph) == []


def test_the_checker_sees_a_cycle_through_a_lazy_import() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = ROOT / "streaming_sink" / "job.py"
    assert "streaming_sink.intervals" in imports("streaming_sink.job", source, modules())


def test_nothing_imports_the_journal_stores_by_their_folder_name() -> None:
    """`state/` is importable as `state` only from a checkout's root; installed, it is `streaming_sink.state`.
    An `import state` would work in the repository's tests and fail for users (or load a second copy)."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] in (".venv", "data", "build"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] == "state"]
    assert offenders == []


def layer_map() -> list[tuple[int, str, list[str]]]:
    """(level, layer, module patterns) from the `layers` block of docs/design.md."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("```layers\n", 1)[1].split("```", 1)[0]
    return [(int(level), layer, patterns) for level, layer, *patterns in (line.split() for line in block.splitlines() if line.strip())]


def layer_of(module: str, layers: list[tuple[int, str, list[str]]]) -> tuple[int, str]:
    short = module.removeprefix("streaming_sink.") if module != "streaming_sink" else module
    found = [(level, layer) for level, layer, patterns in layers if any(fnmatch.fnmatchcase(short, p) for p in patterns)]
    assert len(found) == 1, f"{module}: give it exactly one layer in docs/design.md (found {found})"
    return found[0]


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[int, str, list[str]]]) -> list[str]:
    """Imports that point up the layer map, or across between two rooms of one level."""
    wrong = []
    for name, imported in graph.items():
        level, layer = layer_of(name, layers)
        for other in imported:
            other_level, other_layer = layer_of(other, layers)
            if other_level > level or (other_level == level and other_layer != layer):
                wrong.append(f"{name} ({layer}) imports {other} ({other_layer})")
    return sorted(wrong)


def test_imports_point_down_the_layer_map_of_the_design() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    graph = {name: {t for t in targets if not t.startswith(name + ".")} for name, targets in graph.items()}
    assert upward_imports(graph, layer_map()) == []


def test_the_direction_check_sees_an_import_up_or_across() -> None:
    layers = [(1, "low", ["a"]), (2, "left", ["b"]), (2, "right", ["c"]), (3, "top", ["d"])]
    assert upward_imports({"a": {"d"}, "b": {"c", "a"}, "c": set(), "d": {"b"}}, layers) == [
        "a (low) imports d (top)", "b (left) imports c (right)"]
