"""The tree's shape: the kit's modules import downward without a cycle, and no Python file is long.

Layers, lowest first: common/ (the worker's view); a task folder's files in the view and its solution/ (they import
common/ and other tasks' view); the worker's main program (common/worker.py, which loads the entry points of the task
it serves); harness/ (the trusted machinery); checks/ (each task's checks); the commands in a task folder (test.py,
tune.py, ...: entry points into checks/); grader/. A module may import its own layer or a lower one, never a higher
one, and no set of modules imports itself round. Every import counts, inside a function or under TYPE_CHECKING too
(an import inside a function is how a cycle hides), and so does `import_module` or `__import__` of a name the test
can read.
"""

import ast
import re

from common.tasks import KIT_FOLDERS
from tests.conftest import REPO
from tests.test_tasks import COMMANDS

LONGEST = 450  # lines: a file longer than this is split by job (issue 56)
LAYERS = {"common": 0, "view": 1, "worker": 2, "harness": 3, "checks": 4, "command": 5, "grader": 6}


def _kit_files():
    for top in KIT_FOLDERS:
        yield from (p for p in sorted((REPO / top).rglob("*.py")) if "__pycache__" not in p.parts)


def _module(path):
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(path):
    if path == REPO / "common" / "worker.py":
        return "worker"
    top = path.relative_to(REPO).parts[0]
    if not top.startswith("task"):
        return top
    return "command" if path.parent.name == top and path.name in COMMANDS else "view"


def _dynamic(arg, modules, where):
    """The kit's modules an import_module / __import__ argument can name: a string, an f-string (each {...} stands
    for any text: f"task{n}.entry" is every task's entry.py), or either branch of `a if c else b`."""
    if isinstance(arg, ast.IfExp):
        return _dynamic(arg.body, modules, where) + _dynamic(arg.orelse, modules, where)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr):
        pattern = "".join(re.escape(part.value) if isinstance(part, ast.Constant) else ".+" for part in arg.values)
        return [name for name in modules if re.fullmatch(pattern, name)]
    raise AssertionError(f"{where}: an import of a name this test cannot read; write it as a string or an f-string")


def _imported(path, modules):
    """The kit's modules `path` imports: import statements (relative ones too) and dynamic imports (_dynamic)."""
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    rel = path.relative_to(REPO)
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            # `from pkg import sub` imports pkg.sub; `from pkg import name` imports pkg itself
            names = [*subs, *([base] if any(sub not in modules for sub in subs) else [])]
        elif (isinstance(node, ast.Call) and node.args
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")):
            names = _dynamic(node.args[0], modules, f"{rel}:{node.lineno}")
        yield from (name for name in names if name in modules and name != _module(path))


def test_no_python_file_is_longer_than_a_newcomer_reads():
    files = [*_kit_files(), *(p for p in sorted((REPO / "tests").rglob("*.py")) if "__pycache__" not in p.parts)]
    assert len(files) > 100
    long = [f"{p.relative_to(REPO)}: {n}" for p in files if (n := len(p.read_text().splitlines())) > LONGEST]
    assert not long, f"over {LONGEST} lines, split by job: {long}"


def test_the_kits_modules_import_downward_and_without_a_cycle():
    files = {_module(p): p for p in _kit_files()}
    graph = {name: set(_imported(path, files)) for name, path in files.items()}
    # the dynamic imports are seen: the reference's build, the worker's entry points, task 7's either-or
    assert "task4.attention" in graph["harness.bench"] and "task4.entry" in graph["common.worker"]
    either_or = {"task7.attention", "task7.solution.attention"} & files.keys()  # the handout has no solution/
    assert either_or and either_or <= graph["task7.inference"]
    upward = [f"{a} ({_layer(files[a])}) imports {b} ({_layer(files[b])})" for a, deps in graph.items() for b in deps
              if LAYERS[_layer(files[b])] > LAYERS[_layer(files[a])]]
    assert not upward, upward
    assert not _cycles(graph), _cycles(graph)


def _cycles(graph):
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while not members or members[-1] != node:
                        members.append(stack.pop())
                        on_stack.discard(members[-1])
                    if len(members) > 1:
                        found.append(sorted(members))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child), on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
