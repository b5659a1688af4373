"""The rooms and their import rule, checked on the code itself (docs/architecture.md).

Each room is a folder of the repository installed as a package under ``brimful``.
Imports only go down: ``api`` and ``batcher`` never import each other, the shared core
imports no room, and nothing imports a room by a bare top-level name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.rooms import PACKAGES

ROOT = Path(__file__).resolve().parent.parent

# room -> the rooms it may import (besides itself)
MAY_IMPORT = {
    "brimful": {"api", "batcher", "workers", "model_server", "core", "schemas"},  # the CLI and stack assemble all
    "api": {"core", "schemas"},
    "batcher": {"core", "schemas", "workers"},
    "workers": {"core", "schemas"},
    "model_server": set(),
    "core": {"schemas"},
    "schemas": set(),
    "client": set(),
}
BARE_ROOM_NAMES = {"api", "batcher", "workers", "model_server", "core", "schemas"}


def room_of(module: str) -> str | None:
    """The room an absolute module name belongs to; None for anything not Brimful's."""
    if module == "brimful_client" or module.startswith("brimful_client."):
        return "client"
    parts = module.split(".")
    if parts[0] != "brimful":
        return None
    if len(parts) > 1 and parts[1] in PACKAGES and parts[1] != "brimful":
        return parts[1]
    return "brimful"


def violations(room: str, source: str) -> list[str]:
    """Every import in ``source`` (code of ``room``) that breaks the rule, said in words."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(f"line {node.lineno}: relative import; name the package")
                continue
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            if module.split(".")[0] in BARE_ROOM_NAMES:
                found.append(f"line {node.lineno}: imports {module} by its bare name; use brimful.{module}")
                continue
            target = room_of(module)
            if target is not None and target != room and target not in MAY_IMPORT[room]:
                found.append(f"line {node.lineno}: {room} imports {module} ({target})")
    return found


def room_files() -> list[tuple[str, Path]]:
    return [
        (room, path)
        for room in PACKAGES
        for path in sorted((ROOT / room).rglob("*.py"))
        if not path.name.endswith("_pb2.py")
    ]


@pytest.mark.parametrize(("room", "path"), room_files(), ids=lambda value: str(value))
def test_imports_only_go_down(room: str, path: Path) -> None:
    assert violations(room, path.read_text()) == [], path.relative_to(ROOT)


def test_the_rule_catches_what_it_forbids() -> None:
    assert violations("api", "from brimful.batcher.policy import FlushReason")
    assert violations("batcher", "import brimful.api.app")
    assert violations("core", "from brimful.workers.triton_model import pad_rows")
    assert violations("core", "from brimful.stack import EmbeddedStack")
    assert violations("workers", "from api.state import ApiState")  # a bare room name
    assert violations("client", "from brimful.core.settings import Settings")
    assert violations("api", "from .state import ApiState")
    assert not violations("batcher", "from brimful.workers.batch import Batch\nfrom brimful.core import metrics")
    assert not violations("brimful", "from brimful.batcher.simulator import simulate")


def test_every_room_folder_is_installed_under_its_package() -> None:
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = dict(setuptools["package-dir"].items())
    for folder, package in PACKAGES.items():
        if folder == "client":
            continue  # its own distribution (client/pyproject.toml)
        assert mapped.get(package) == folder, f"{folder}/ is not installed as {package}"
    assert all(name == "brimful" or name.startswith("brimful.") for name in setuptools["packages"])


ROUTE_IMPORTERS = {Path("api/app.py"), Path("api/http/direct_lane.py")}


def route_imports(source: str) -> list[str]:
    """The route modules (``*_routes``) that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [name for name in names if name.startswith("brimful.api.") and name.endswith("_routes")]
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "api").rglob("*.py")), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_route_module_is_imported_but_by_what_serves_or_describes_routes(path: Path) -> None:
    # A route module holds routes; what two routes share lives in a module of its own, so
    # that a job driver, a sender or another route never reaches into one. Only the app
    # (which mounts them), the direct lane (which answers the two task routes with their
    # handlers) and the OpenAPI document (which shows each route's limits from where they
    # are enforced) import route modules.
    relative = path.relative_to(ROOT)
    if relative in ROUTE_IMPORTERS or relative.parent == Path("api/openapi"):
        return
    assert route_imports(path.read_text()) == [], relative


def test_the_route_rule_sees_both_spellings() -> None:
    assert route_imports("from brimful.api.openai import file_routes") == ["brimful.api.openai.file_routes"]
    assert route_imports("from brimful.api.openai.file_routes import FILES_PATH") == ["brimful.api.openai.file_routes"]
    assert route_imports("from brimful.api.http.list_pages import page_limit") == []
