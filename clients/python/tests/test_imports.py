"""The package's modules import no cycle: every import between them (module level or inside a function, but
not under ``if TYPE_CHECKING:``, which never runs) forms an acyclic graph; each module imports alone in a
fresh interpreter; the consumer's modules import without numpy, and a view that needs it says so."""

import ast
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_DIR = os.path.join(os.path.dirname(HERE), "ibvbridge")
MODULES = sorted(f[:-3] for f in os.listdir(PKG_DIR) if f.endswith(".py") and f != "__init__.py")
# The consumer side: importable where numpy is not installed (numpy is needed for views, batches, chunks).
WITHOUT_NUMPY = ["ring", "chunks", "aio", "views", "metadata", "layout", "shared", "errors", "_sys"]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, modules: set) -> set:
    """The package modules a module's code imports, skipping the bodies of ``if TYPE_CHECKING:``. An
    import of the package itself (``from . import __version__``) is no edge: the package's __init__ runs
    before any of its modules."""
    out = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.add(node.module.split(".")[0])
            elif node.level == 1:
                out.update(a.name for a in node.names if a.name in modules)
            elif node.level == 0 and node.module and node.module.startswith("ibvbridge."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ibvbridge."):
                    out.add(a.name.split(".")[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out & modules


def import_graph(pkg_dir: str = PKG_DIR) -> dict:
    modules = {f[:-3] for f in os.listdir(pkg_dir) if f.endswith(".py") and f != "__init__.py"}
    graph = {}
    for m in sorted(modules):
        with open(os.path.join(pkg_dir, m + ".py"), encoding="utf-8") as f:
            graph[m] = _imports(ast.parse(f.read()), modules) - {m}
    return graph


def find_cycle(graph: dict) -> list:
    """One cycle of graph as [a, b, ..., a], or [] when it has none (depth-first search)."""
    state, stack = {}, []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                c = dfs(n)
                if c:
                    return c
        stack.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state:
            c = dfs(m)
            if c:
                return c
    return []


def test_package_modules_import_each_other_without_a_cycle():
    g = import_graph()
    assert {"ring", "chunks", "aio", "items", "views", "metadata"} <= set(g)
    assert "chunks" in g["ring"] and "views" in g["chunks"]  # the walk sees real edges
    assert find_cycle(g) == []


def test_cycle_finder_reports_a_reintroduced_cycle(tmp_path):
    # chunks importing ring again (as it once did for Heap and Batch) is a cycle the walk must find
    for m in MODULES:
        src = open(os.path.join(PKG_DIR, m + ".py"), encoding="utf-8").read()
        if m == "chunks":
            src += "\n\ndef _back():\n    from .ring import Ring\n    return Ring\n"
        (tmp_path / (m + ".py")).write_text(src, encoding="utf-8")
    cycle = find_cycle(import_graph(str(tmp_path)))
    assert cycle[0] == cycle[-1] and {"ring", "chunks"} <= set(cycle)


def test_each_module_imports_alone_in_a_fresh_interpreter():
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module('ibvbridge.' + m)\n"
    for m in MODULES:
        r = subprocess.run([sys.executable, "-c", code, m], cwd=os.path.dirname(PKG_DIR), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"import ibvbridge.{m}: {r.stderr}"


def test_consumer_modules_import_without_numpy_and_views_say_numpy_is_needed():
    code = ("import sys\nsys.modules['numpy'] = None  # import numpy raises ImportError\n"
            "import importlib\n"
            "for m in sys.argv[1:]:\n    importlib.import_module('ibvbridge.' + m)\n"
            "from ibvbridge import views\nfrom ibvbridge.errors import RingError\n"
            "try:\n    views._need_numpy()\nexcept RingError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code] + WITHOUT_NUMPY, cwd=os.path.dirname(PKG_DIR),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "numpy is required for array views" in r.stdout


def reach(graph: dict, start: str) -> set:
    """Every module start imports, directly or through others (function-level imports included)."""
    seen, todo = set(), [start]
    while todo:
        for n in graph.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_a_consumers_modules_never_import_the_producer():
    # Importing producer.py inside a consumer's loop (as a descriptor heap's first parse once did, to reach
    # the record encoder) stalls that loop for the import: 40 ms where no bytecode is cached, a tail of
    # hundreds of late heaps.
    g = import_graph()
    for m in ("ring", "items", "chunks", "views", "metadata", "aio"):
        assert "producer" not in reach(g, m), f"ibvbridge.{m} imports ibvbridge.producer"
    assert "metadata" in reach(g, "items")  # the walk sees the descriptor parser's real edge
