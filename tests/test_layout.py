"""The layout is the architecture (docs/architecture.md):

- ``common/`` (what the services share) imports no service package;
- the gateway reaches the runners only through their service classes (for ``bentoml.depends``)
  and their APIs in ``common/``, never through their cores;
- the cores import no BentoML: only the three service modules, the metrics modules and the
  adapter ``common/bento/`` do (and the offline tooling, ``training_export/`` and ``bentos/``);
- the service modules hold wiring only: the service class, the assembly of its core, the
  endpoints exposed; no loops, no comprehensions, short functions;
- no import circle anywhere in the product code, function-local imports included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("common", "services", "runners", "training_export", "bentos")
SERVICE_PACKAGES = ("services", "runners", "training_export", "bentos", "harness", "bench")
SERVICE_MODULES = {"services.gateway", "runners.feature.service", "runners.graphsage.service"}
# Where BentoML may be imported besides the service modules.
BENTOML_ALLOWED = ("common.bento", "training_export", "bentos")
MAX_WIRING_STATEMENTS = 15


# BentoML and the packages its SDK ships as.
BENTOML_PACKAGES = frozenset({"bentoml", "_bentoml_sdk", "_bentoml_impl"})


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "grpc_gen" not in p.parts)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, known: set[str] | None = None) -> set[str]:
    """Every module ``path`` imports where it runs, function-local imports included (imports under
    ``if TYPE_CHECKING`` never run). ``from a import b`` is ``a.b`` when that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node) for n in ast.walk(node)
    }
    out: set[str] = set()
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if known is not None and full in known else base)
    return out


def test_the_shared_package_imports_no_service_package():
    wrong = {
        str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.split(".")[0] in SERVICE_PACKAGES)
        for p in _modules("common")
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_the_gateway_reaches_the_runners_only_through_their_service_classes():
    wrong = {
        str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.startswith("runners") and m not in SERVICE_MODULES)
        for p in _modules("services")
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_the_cores_import_no_bentoml():
    wrong = {}
    for package in ("common", "services", "runners"):
        for path in _modules(package):
            name = _name(path)
            if name in SERVICE_MODULES or name.endswith(".metrics") or name.startswith(BENTOML_ALLOWED):
                continue
            found = sorted(m for m in _imports(path) if m.split(".")[0] in BENTOML_PACKAGES)
            if found:
                wrong[name] = found
    assert not wrong, wrong


def _statements(fn: ast.AST) -> int:
    return sum(isinstance(n, ast.stmt) for n in ast.walk(fn)) - 1


def test_the_service_modules_hold_wiring_only():
    problems = []
    for name in sorted(SERVICE_MODULES):
        tree = ast.parse((ROOT / (name.replace(".", "/") + ".py")).read_text())
        for node in ast.walk(tree):
            if isinstance(
                node, (ast.For, ast.While, ast.AsyncFor, ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp)
            ):
                problems.append(f"{name}:{node.lineno}: {type(node).__name__} (logic belongs in a core)")
            elif (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _statements(node) > MAX_WIRING_STATEMENTS
            ):
                problems.append(f"{name}:{node.lineno}: {node.name} has {_statements(node)} statements")
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        assert len(classes) == 1, (name, [c.name for c in classes])  # the service, nothing else
    assert not problems, problems


def test_no_import_circle_in_the_product_code():
    paths = {_name(p): p for package in PRODUCT for p in _modules(package)}
    known = set(paths)
    graph = {name: {m for m in _imports(path, known) if m in known and m != name} for name, path in paths.items()}
    circles = _cycles(graph)
    assert not circles, circles


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_check_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
