"""The packages are layers and their imports run one way, downward (docs/STYLE.md, layout).

Every file under bcg/ is parsed with ``ast``, imports inside functions included, so a lazy import
cannot hide a cycle or an upward import from these checks.
"""

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "bcg"

# what each layer may import besides itself, bottom to top; ``bcg`` (the version) is open to all
LAYERS = {
    "core": set(),
    "sim": {"core"},
    "motion": {"core"},
    "g1sim": {"core", "sim"},
    "learn": {"core", "sim", "motion", "g1sim"},
    "validate": {"core", "sim", "motion", "g1sim", "learn"},
    "robot": {"core", "sim", "motion", "g1sim", "learn"},
    "studies": {"core", "sim", "motion", "g1sim", "learn", "validate", "robot"},
}
# the simulator knows no robot: of the ground floor it may use only these
SIM_MAY_USE = {"bcg.core", "bcg.core.rotations", "bcg.core.atomic", "bcg.core.geoms"}


def module_name(path: Path, root: Path) -> str:
    parts = ("bcg", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str | None:
    """The layer of a module (None for the ``bcg`` package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


class Import:
    def __init__(self, target: str, line: int, in_function: bool):
        self.target, self.line, self.in_function = target, line, in_function


def imports_of(path: Path, root: Path, modules: set[str]) -> list[Import]:
    """The bcg modules ``path`` imports, each resolved to a file's module: ``from bcg.x import y``
    names the submodule ``bcg.x.y`` when there is one, else the package ``bcg.x``."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Import(a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    out.append(Import(sub if sub in modules else base, child.lineno, in_function))
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    unique = {(i.target, i.line): i for i in out}.values()  # ``from x import a, b`` is one import of x
    return [i for i in unique if i.target.split(".")[0] == "bcg" or i.in_function]


def commented_lines(path: Path) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {t.start[0] for t in tokens if t.type == tokenize.COMMENT}


def problems(root: Path = ROOT) -> list[str]:
    """Every breach of the layering in the package at ``root``, one line each."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    found = []
    for name, path in files.items():
        where = path.relative_to(root.parent)
        comments = commented_lines(path)
        graph[name] = set()
        for imp in imports_of(path, root, modules):
            if imp.in_function and not {imp.line, imp.line - 1} & comments:
                found.append(f"{where}:{imp.line}: imports {imp.target} inside a function without a comment")
            if imp.target.split(".")[0] != "bcg":
                continue
            own, other = layer(name), layer(imp.target)
            if imp.target in files:
                graph[name].add(imp.target)
            if other is None or own is None or other == own:
                continue
            if other not in LAYERS.get(own, set()):
                found.append(f"{where}:{imp.line}: {own} imports {imp.target} ({other} is not below {own})")
            elif own == "sim" and other == "core" and imp.target not in SIM_MAY_USE:
                found.append(f"{where}:{imp.line}: the simulator imports {imp.target}, which knows the robot")
    found += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one module (or a self-import)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    out = []
    for group in groups:  # walk from the group's first module back to it, inside the group
        start, members = group[0], set(group)
        path, seen = [start], {start}
        while True:
            nxt = sorted(graph[path[-1]] & members)
            back = start if start in nxt else None
            if back:
                out.append(path + [start])
                break
            step = next((w for w in nxt if w not in seen), nxt[0])
            if step in seen:
                out.append(path[path.index(step) :] + [step])
                break
            path.append(step)
            seen.add(step)
    return out


def test_the_packages_are_layers_without_cycles_or_hidden_imports():
    assert problems() == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "bcg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "bcg"


CLEAN = {
    "__init__.py": "",
    "core/__init__.py": "",
    "core/rotations.py": "",
    "core/g1.py": "",
    "sim/__init__.py": "from bcg.core import rotations\n",
    "learn/__init__.py": "",
    "learn/a.py": "from bcg.learn import b\n",
    "learn/b.py": "import bcg.sim\n\n\ndef f():\n    # the plot is drawn on request\n    import matplotlib\n",
    "robot/__init__.py": "",
    "validate/__init__.py": "",
}


@pytest.mark.parametrize(
    ("plant", "expected"),
    [
        ({"sim/x.py": "from bcg.learn import a\n"}, "sim imports bcg.learn.a"),
        ({"core/x.py": "def f():\n    # lazy\n    import bcg.sim\n"}, "core imports bcg.sim"),
        ({"sim/x.py": "from bcg.core import g1\n"}, "the simulator imports bcg.core.g1"),
        ({"robot/x.py": "import bcg.validate\n"}, "robot imports bcg.validate"),
        ({"validate/x.py": "from bcg.robot import y\n"}, "validate imports bcg.robot"),
        ({"learn/b.py": "def f():\n    # lazy\n    from bcg.learn import a\n"}, "import cycle: bcg.learn.a"),
        ({"learn/c.py": "def f():\n    from bcg.learn import a\n"}, "inside a function without a comment"),
        ({"learn/c.py": "def f():\n    import json\n"}, "imports json inside a function"),
    ],
)
def test_a_planted_bad_import_is_caught(tmp_path, plant, expected):
    root = write_package(tmp_path, CLEAN)
    assert problems(root) == []
    write_package(tmp_path, plant)
    assert any(expected in p for p in problems(root)), problems(root)
