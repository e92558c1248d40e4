"""The package's structure: its imports run one way, no module reads another's private names, and
docs/architecture.md, the one code map, has a line for every module and none for a module that is gone.

The import tests read the source with `ast` rather than importing it, so an import inside a function (the usual way
to hide a cycle from Python) counts exactly like one at the top of a module. Known violations are listed
below by name; a new one fails, and so does a listed one that has gone (so the lists only shrink).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

PKG = "sglang_oom_exporter"
SRC = Path(__file__).resolve().parent.parent / "exporter"

# Import cycles left, as strongly connected components of the module graph: none. render/'s options and
# shared constants live in render/options.py, which the renderers import instead of the package.
ALLOWED_MODULE_CYCLES: frozenset[frozenset[str]] = frozenset()

# Cycles between the package's top-level parts (a subpackage, or a top-level module), as components.
# None is left: scan/ and web/ use the event sink and store in events/, not daemon/, and sources/ is given
# its settings rather than importing config/.
ALLOWED_PACKAGE_CYCLES: frozenset[frozenset[str]] = frozenset()

# (module path relative to exporter/, the expression or imported name) for each read of another module's or
# object's private name: none is left.
ALLOWED_PRIVATE_READS: frozenset[tuple[str, str]] = frozenset()


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PKG, *parts))


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imported(name: str, is_package: bool, text: str, known: Set[str]) -> Iterator[str]:
    """The package's modules that `name` imports anywhere in its text (relative imports resolved).

    `from a import b` imports a.b when that is a module, and a otherwise; importing a.b.c also runs a and
    a.b, but those are its parents, not what the code depends on, so they are not edges.
    """
    package = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()  # `import a.b.c` where c is a name, or a stdlib/third-party module (nothing left)
            if parts and ".".join(parts) != name:
                yield ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {
        name: set(imported(name, path.name == "__init__.py", path.read_text(encoding="utf-8"), found.keys()))
        for name, path in found.items()
    }


def cycles(graph: Mapping[str, Set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            child = next(todo, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
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
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def top_level(name: str) -> str:
    return ".".join(name.split(".")[:2])


def package_graph(graph: Mapping[str, Set[str]]) -> dict[str, set[str]]:
    collapsed: dict[str, set[str]] = {top_level(name): set() for name in graph}
    for name, targets in graph.items():
        collapsed[top_level(name)].update(top_level(t) for t in targets if top_level(t) != top_level(name))
    return collapsed


def test_the_cycle_finder_finds_cycles_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"f"}}
    assert cycles(graph) == {frozenset({"a", "b", "c"})}


def test_imports_inside_functions_and_relative_imports_are_edges() -> None:
    known = {"p", "p.a", "p.a.b", "p.c", "p.d", "p.e"}
    text = "import os\nfrom . import b\nfrom .. import c\ndef f():\n    from ..d import thing\n    import p.e.name\n"
    assert set(imported("p.a.x", False, text, known)) == {"p.a.b", "p.c", "p.d", "p.e"}
    assert set(imported("p.a", True, "from . import b\nfrom .b import y\n", known)) == {"p.a.b"}


def test_no_import_cycle_between_modules() -> None:
    assert cycles(import_graph()) == ALLOWED_MODULE_CYCLES


def test_no_import_cycle_between_packages() -> None:
    """Collapsed to the package's parts (config, daemon, scan, sources, web, ...), imports still run one way."""
    found = cycles(package_graph(import_graph()))
    explained = {
        component: sorted(f"{a} -> {b}" for a in component for b in package_graph(import_graph())[a] if b in component)
        for component in found - ALLOWED_PACKAGE_CYCLES
    }
    assert found == ALLOWED_PACKAGE_CYCLES, explained


# The package's parts in layers, lowest first: a part imports only parts of lower layers. This is the picture
# docs/architecture.md draws; a new part must be placed here (the test fails until it is).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "sglang_oom_exporter errors project progress",  # the package's version, its error type, its URL, a bar
        "catalog sources",  # the kinds; files, stdin and SGLang endpoints (handed their settings)
        "detect config",  # the pure pipeline stages; the settings table and the config file
        "advise metrics",  # the suggestion rules; the counters and the /metrics page
        "events render",  # the sink, store and redaction; the alert pack
        "scan kubeevents",  # the offline scan; Kubernetes Events for pages
        "daemon web",  # serve's source set, loop and state (never the web); the HTTP edge
        "serve",  # the composition root: daemon/ wired to web/
        "cli",
        "__main__",
    )
)


def test_every_part_imports_only_lower_layers() -> None:
    graph = package_graph(import_graph())
    short = {name: name.removeprefix(f"{PKG}.") for name in graph}
    layer = {part: i for i, parts in enumerate(LAYERS) for part in parts}
    assert sorted(set(short.values()) - set(layer)) == []  # every part has its layer
    upward = sorted(
        f"{short[a]} (layer {layer[short[a]]}) -> {short[b]} (layer {layer[short[b]]})"
        for a, targets in graph.items()
        for b in targets
        if b != a and layer[short[b]] >= layer[short[a]]
    )
    assert upward == []


def private_reads(relative: str, tree: ast.Module) -> Iterator[str]:
    """Each `from x import _name` and each `value._name` whose value is not self, cls or this module's own class."""
    own = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield f"from {'.' * node.level}{node.module or ''} import {alias.name}"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            value = node.value
            if isinstance(value, ast.Name) and value.id in {"self", "cls", *own}:
                continue
            yield ast.unparse(node)


def test_no_module_reads_another_modules_private_names() -> None:
    found = {
        (str(path.relative_to(SRC)), read)
        for path in sorted(SRC.rglob("*.py"))
        for read in private_reads(str(path.relative_to(SRC)), ast.parse(path.read_text(encoding="utf-8")))
    }
    assert sorted(found - ALLOWED_PRIVATE_READS) == [], "new reads of private names"
    assert sorted(ALLOWED_PRIVATE_READS - found) == [], "fixed: remove these from ALLOWED_PRIVATE_READS"


def test_the_private_read_finder() -> None:
    tree = ast.parse(
        "from .a import _x, y\nclass C:\n    _k = 1\n    def f(self):\n"
        "        return self._a, self._b._c, other._d, C._k, cls._e\n"
    )
    assert sorted(private_reads("m.py", tree)) == ["from .a import _x", "other._d", "self._b._c"]


# The catalog's one way in: its package (the façade: values, loading, errors, the checks) and its closed lists.
CATALOG_PUBLIC = frozenset({f"{PKG}.catalog", f"{PKG}.catalog.vocabulary"})


def test_code_outside_the_catalog_imports_it_through_its_facade() -> None:
    """No module outside catalog/ imports loader, model, validate, ... directly: one façade, one import path."""
    found = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        if not name.startswith(f"{PKG}.catalog")
        for target in targets
        if target.startswith(f"{PKG}.catalog.") and target not in CATALOG_PUBLIC
    )
    assert found == []


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (under if/try too): functions, classes, assignments."""
    found: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.If | ast.Try):
            body.extend([*node.body, *node.orelse, *getattr(node, "finalbody", []),
                         *(s for h in getattr(node, "handlers", []) for s in h.body)])  # fmt: skip
    return found


def borrowed_imports(path: Path, text: str, known: Mapping[str, set[str]]) -> Iterator[str]:
    """`from M import x` of one of our modules M where x is neither defined in M nor a submodule of it."""
    name = module_name(path) if path.is_relative_to(SRC) else ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        if source not in known or source == f"{PKG}.catalog":  # the catalog's façade is its one way in
            continue
        for alias in node.names:
            if alias.name not in known[source] and f"{source}.{alias.name}" not in known:
                yield f"{path.relative_to(SRC.parent)}:{node.lineno}: {alias.name} from {source}"


def test_every_name_is_imported_from_the_module_that_defines_it() -> None:
    """No re-exports: a name has one import path, its defining module's (the catalog's façade apart)."""
    known = {name: defined_names(ast.parse(path.read_text())) for name, path in modules().items()}
    files = [p for d in (SRC, TESTS, SRC.parent / "bench", SRC.parent / "tools") for p in sorted(d.rglob("*.py"))]
    assert [found for p in files for found in borrowed_imports(p, p.read_text(), known)] == []


def test_the_borrowed_import_finder() -> None:
    known = {f"{PKG}.web.server": {"ExporterServer"}, f"{PKG}.web.httpd": {"MAX_HEAD_BYTES"}}
    text = f"from {PKG}.web.server import ExporterServer, MAX_HEAD_BYTES\nfrom {PKG}.web.httpd import MAX_HEAD_BYTES\n"
    path = TESTS / "test_x.py"
    assert list(borrowed_imports(path, text, known)) == [f"tests/test_x.py:1: MAX_HEAD_BYTES from {PKG}.web.server"]


# --------------------------------------------------------------------------------------------------- the code map

MAP = SRC.parent / "docs" / "architecture.md"


def mapped_modules(text: str) -> list[str]:
    """The modules the map's "Every module" section names, in order: one `- `path`: what it is` line each."""
    section = text.split("\n## Every module\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `([^`]+)`:", section, flags=re.M)


def test_the_map_reader() -> None:
    text = "# A\n- `x.py`: no\n## Every module\n\n**`a/`**\n- `a/b.py`: b\n  `c.py`: no\n- `d.py`: d\n## Next\n- `e.py`: e\n"
    assert mapped_modules(text) == ["a/b.py", "d.py"]


def test_the_code_map_has_one_line_for_every_module_and_none_for_a_module_that_is_gone() -> None:
    """docs/architecture.md is the one code map: every .py under exporter/ (package __init__.py files and
    __main__.py too) has exactly one line in it, and every line names a module that exists."""
    listed = mapped_modules(MAP.read_text(encoding="utf-8"))
    present = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")}
    assert sorted({m for m in listed if listed.count(m) > 1}) == [], "listed twice in docs/architecture.md"
    assert sorted(present - set(listed)) == [], "modules missing from docs/architecture.md's Every module"
    assert sorted(set(listed) - present) == [], "docs/architecture.md lists modules that do not exist"


def test_every_python_file_the_map_names_exists() -> None:
    """The prose and the pictures name modules too (`daemon/lazypipe.py`, `tests/test_architecture.py`): each
    backquoted path ending in .py is a file under exporter/ or the repository root."""
    named = set(re.findall(r"`([\w./]+\.py)`", MAP.read_text(encoding="utf-8")))
    assert len(named) > 100
    assert sorted(n for n in named if not (SRC / n).is_file() and not (SRC.parent / n).is_file()) == []


def modules_named_in_package_docstrings() -> dict[str, list[str]]:
    """Each package's __init__.py -> the modules of that package its docstring names (`loop.py`, `poster.py`)."""
    out: dict[str, list[str]] = {}
    for init in sorted(SRC.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        own = {p.name for p in init.parent.glob("*.py")}
        named = sorted({n for n in re.findall(r"\b(\w+\.py)\b", doc) if n in own})
        if named:
            out[str(init.relative_to(SRC))] = named
    return out


def test_no_package_docstring_keeps_a_map_of_its_own() -> None:
    """A package's docstring says what the package is; its modules are listed once, in docs/architecture.md, so a
    second list cannot drift from it."""
    assert modules_named_in_package_docstrings() == {}


# ---------------------------------------------------------------------------------------------- the tests' harness

TESTS = SRC.parent / "tests"


def harness_breaches(text: str) -> Iterator[str]:
    """What a test module must not do: import another test module (shared harness belongs in tests/support), or
    read a private `_name` of tests.support (`from tests.support.x import _name`, or `x._name` on a support module
    it imported). Imports inside functions count like the others."""
    tree = ast.parse(text)
    support_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [(alias.name, "", alias.asname) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found = [(node.module or "", alias.name, alias.asname) for alias in node.names]
        else:
            continue
        for module, name, asname in found:
            path = f"{module}.{name}".strip(".").split(".")
            if path[0] == "tests" and len(path) > 1 and path[1].startswith("test_"):
                yield f"imports {'.'.join(path[:2])}"
            if module.startswith("tests.support") and name.startswith("_") and not name.startswith("__"):
                yield f"reads {module}.{name}"
            if ".".join(path[:2]) == "tests.support" and (name or asname):
                support_names.add(asname or name or path[-1])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in support_names
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield f"reads {node.value.id}.{node.attr}"


def test_the_harness_breach_finder() -> None:
    text = (
        "from tests.test_app import BLOCK\nfrom tests import test_serve_e2e\nimport tests.test_cli as c\n"
        "from tests.support.daemon import Daemon, _private\nfrom tests.support import helpers\n"
        "def f():\n    from tests.test_helm import template\n    return helpers._x, helpers.wait_until, other._y\n"
    )
    assert sorted(harness_breaches(text)) == [
        "imports tests.test_app", "imports tests.test_cli", "imports tests.test_helm", "imports tests.test_serve_e2e",
        "reads helpers._x", "reads tests.support.daemon._private",
    ]  # fmt: skip
    assert list(harness_breaches("from tests.support.helpers import wait_until\nimport tests.support.logs\n")) == []


def test_test_modules_share_their_harness_only_through_tests_support() -> None:
    """No test module imports another (13 did: their fixtures and builders now live in tests/support), and neither
    the harness nor the benchmarks and tools that reuse it (bench/fuzz.py, tools/mutate_alerts.py) import one."""
    root = TESTS.parent
    files = [*sorted(TESTS.glob("test_*.py")), TESTS / "conftest.py", *sorted((TESTS / "support").glob("*.py"))]
    files += [*sorted((root / "bench").glob("*.py")), *sorted((root / "tools").glob("*.py"))]  # they share it too
    found = {
        f"{path.relative_to(root)}: {breach}"
        for path in files
        for breach in harness_breaches(path.read_text(encoding="utf-8"))
    }
    assert sorted(found) == []
