"""The house's import rules, read from the floors table of docs/architecture.md: every module of tx/ lives in
a room of that table; a module imports only its own room and rooms on lower floors; no import circle.

Every import counts, at module level or inside a function or an `if TYPE_CHECKING:` block: each is an arrow
a reader has to follow. `tx` and `tx.inference` name their package file only (their subpackages are rooms of
their own).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES_ONLY = {"tx", "tx.inference"}


def floors() -> dict[str, int]:
    """{room: floor} from the table under the `<!-- floors: ... -->` comment of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("<!-- floors:"):]
    rooms: dict[str, int] = {}
    for line in table.splitlines()[1:]:
        if not line.startswith("|"):
            if rooms:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].isdigit():
            for room in re.findall(r"`([\w.]+)`", cells[1]):
                rooms[room] = int(cells[0])
    assert rooms, "docs/architecture.md has no floors table"
    return rooms


def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "tx").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1].endswith("_pb2"):  # generated
            continue
        found[".".join(parts)] = path
    return found


def room_of(module: str, rooms: dict[str, int]) -> str | None:
    matches = [r for r in rooms if module == r or (module.startswith(r + ".") and r not in PACKAGE_FILES_ONLY)]
    return max(matches, key=len, default=None)


def imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported tx module, line) for every import in the file, resolved to the most specific module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tx" or alias.name.startswith("tx."):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base != "tx" and not base.startswith("tx."):
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}"
                yield (target if target in known else base), node.lineno


def arrows() -> dict[str, list[tuple[str, int]]]:
    known = modules()
    return {module: [(t, line) for t, line in imports(module, path, known) if t in known and t != module]
            for module, path in known.items()}


def test_every_module_lives_in_a_room_of_the_floors_table() -> None:
    rooms = floors()
    homeless = sorted(m for m in modules() if room_of(m, rooms) is None)
    assert not homeless, f"modules in no room of docs/architecture.md's floors table: {homeless}"


def test_no_import_runs_up_or_across_a_floor() -> None:
    rooms = floors()
    wrong = []
    for module, targets in arrows().items():
        here = room_of(module, rooms)
        for target, line in targets:
            there = room_of(target, rooms)
            if here is None or there is None or here == there:
                continue
            if rooms[there] >= rooms[here]:
                wrong.append(f"{module}:{line} ({here}, floor {rooms[here]}) imports {target} "
                             f"({there}, floor {rooms[there]})")
    assert not wrong, "imports that run up or across the floors of docs/architecture.md:\n" + "\n".join(wrong)


def test_no_import_circle() -> None:
    graph = {module: sorted({t for t, _ in targets}) for module, targets in arrows().items()}
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in circles)


def strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, []))))
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
                components.append(component)
    return components


def test_the_rules_catch_what_they_are_for() -> None:
    """The checks themselves: a circle is found, a room is found for a nested module, an arrow resolves."""
    assert [sorted(c) for c in strongly_connected({"a": ["b"], "b": ["a"], "c": ["a"]}) if len(c) > 1] == [["a", "b"]]
    rooms = {"tx": 0, "tx.inference": 0, "tx.inference.manager": 5}
    assert room_of("tx.inference.manager.groups", rooms) == "tx.inference.manager"
    assert room_of("tx.inference.new_thing", rooms) is None
