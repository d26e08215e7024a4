"""The layers hold: every import in src/stallscope (module level or inside a function: a lazy import is
still an import) goes down the arrows of tests/layers.json, none breaks a `never` rule, and no files
import each other, directly or in a circle.

tests/layers.json is the project's drawing of its layers (parts, arrows, never rules). A part may import
any part below it, i.e. any part its arrows reach, one arrow after another; a `never` rule holds for
direct imports. Change the drawing in the same commit as the code that needs it.
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = "stallscope"
LAYERS = json.loads((Path(__file__).with_name("layers.json")).read_text(encoding="utf-8"))


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    modules = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _rel(module: str) -> str:
    return MODULES[module].relative_to(REPO).as_posix()


def _existing(name: str) -> str | None:
    """The module `name` names, or the longest dotted prefix of it that is a module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """The package's modules that `module` imports, anywhere in the file. `from a import b` is an import
    of module a.b where there is one, else of a; `import a.b.c` of the deepest of a.b.c, a.b, a that is
    a module (loading a submodule loads its packages' __init__ too, but only the one named is counted)."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = _existing(name)
                if target and target != module:
                    found.add(target)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def part_of(module: str) -> str | None:
    """The part whose `is` entry matches the file most closely (a file beats a folder around it)."""
    path = _rel(module)
    best, best_length = None, -1
    for name, part in LAYERS["parts"].items():
        for entry in part["is"]:
            if (path == entry or (entry.endswith("/") and path.startswith(entry))) and len(entry) > best_length:
                best, best_length = name, len(entry)
    return best


def below(part: str) -> set[str]:
    """The parts `part` may import: those its arrows reach, one after another."""
    arrows = defaultdict(set)
    for source, target in LAYERS["arrows"]:
        arrows[source].add(target)
    seen, todo = set(), list(arrows[part])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(arrows[name])
    return seen


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, without recursion: the components of more than one node."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_drawing_is_whole_and_true():
    """Every part names files that exist, every file is in a part, the arrows run one way (no circle
    of parts), and no arrow is also a never rule."""
    missing = [f"{name}: {entry}" for name, part in LAYERS["parts"].items() for entry in part["is"]
               if not (REPO / entry).exists()]
    assert not missing, "layers.json names paths that do not exist:\n" + "\n".join(missing)
    homeless = [_rel(module) for module in MODULES if part_of(module) is None]
    assert not homeless, "files in no part of layers.json:\n" + "\n".join(homeless)
    names = set(LAYERS["parts"])
    unknown = [rule for rule in LAYERS["arrows"] + LAYERS["never"] if not set(rule[:2]) <= names]
    assert not unknown, f"arrows or never rules between unknown parts: {unknown}"
    circles = [part for part in names if part in below(part)]
    assert not circles, f"the arrows run in a circle through {sorted(circles)}"
    both = [rule for rule in LAYERS["never"] if list(rule[:2]) in LAYERS["arrows"]]
    assert not both, f"both an arrow and a never rule: {both}"


def _crossings() -> list[tuple[str, str, str, str]]:
    """(from part, to part, from file, to file) for each import between two parts."""
    crossings = []
    for module, targets in sorted(GRAPH.items()):
        for target in sorted(targets):
            source_part, target_part = part_of(module), part_of(target)
            if source_part != target_part:
                crossings.append((source_part, target_part, _rel(module), _rel(target)))
    return crossings


def test_no_import_breaks_a_never_rule():
    never = {(a, b): why for a, b, why in LAYERS["never"]}
    broken = [f"{src} imports {dst}: {a} -> {b} never ({never[a, b]})"
              for a, b, src, dst in _crossings() if (a, b) in never]
    assert not broken, "\n".join(broken)


def test_every_import_goes_down_an_arrow():
    upward = [f"{src} imports {dst}: no arrow leads from {a} to {b}"
              for a, b, src, dst in _crossings() if b not in below(a)]
    assert not upward, "\n".join(upward)


# Circles not broken yet, each exactly as it stands: the test fails when one grows, shrinks or goes, so
# this list only gets shorter. None is left: a new circle fails the test.
KNOWN_CIRCLES: list[set[str]] = []


def test_no_files_import_each_other():
    found, circles = [], []
    for component in strongly_connected(GRAPH):
        members = set(component)
        found.append({_rel(m) for m in component})
        if found[-1] in KNOWN_CIRCLES:
            continue
        edges = sorted(f"{_rel(m)} -> {_rel(t)}" for m in component for t in GRAPH[m] if t in members)
        circles.append(f"{len(component)} files in a circle: {', '.join(_rel(m) for m in component)}\n    "
                       + "\n    ".join(edges))
    assert not circles, "\n".join(circles)
    gone = [sorted(known) for known in KNOWN_CIRCLES if known not in found]
    assert not gone, f"no longer a circle, take it out of KNOWN_CIRCLES: {gone}"
