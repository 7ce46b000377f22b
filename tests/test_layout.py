"""The layout is the architecture: ``common/`` (what the services share) imports no service
package, and the gateway reaches the runners only through their service classes (for
``bentoml.depends``), never through their cores."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE_PACKAGES = ("services", "runners", "training_export", "bentos", "harness", "bench")
RUNNER_SERVICES = {"runners.feature.service", "runners.graphsage.service"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "grpc_gen" not in p.parts)


def test_the_shared_package_imports_no_service_package():
    wrong = {
        str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.split(".")[0] in SERVICE_PACKAGES)
        for p in _modules("common")
    }
    assert not {k: v for k, v in wrong.items() if v}


def test_the_gateway_reaches_the_runners_only_through_their_service_classes():
    wrong = {
        str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.startswith("runners") and m not in RUNNER_SERVICES)
        for p in _modules("services")
    }
    assert not {k: v for k, v in wrong.items() if v}
