"""What installing Brimful puts on a machine: the server only under ``brimful``, and the
Python client on its own with nothing of the server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER_FOLDERS = ("brimful", "api", "batcher", "workers", "model_server", "core", "schemas")
# What the server needs and a client must never be made to install.
SERVER_DISTRIBUTIONS = {
    "brimful",
    "fastapi",
    "starlette",
    "uvicorn",
    "aiokafka",
    "redis",
    "hiredis",
    "numpy",
    "pyarrow",
    "tritonclient",
    "grpcio",
    "protobuf",
    "pydantic",
    "pydantic-settings",
    "prometheus-client",
    "nvidia-pytriton",
}

pytestmark = pytest.mark.timeout(300)


def copy_sources(destination: Path, names: tuple[str, ...]) -> Path:
    """A copy of part of the repository, so building leaves nothing in the checkout."""
    destination.mkdir(parents=True)
    for name in names:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, destination / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
            )
        else:
            shutil.copy(source, destination / name)
    return destination


def test_the_client_installs_alone_with_no_server_dependency(tmp_path: Path) -> None:
    sources = copy_sources(tmp_path / "src", ("client",))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(sources / "client")], check=True, cwd=tmp_path)

    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True, cwd=tmp_path
    ).stdout
    installed = {entry["name"].lower().replace("_", "-") for entry in json.loads(listed)}
    assert "brimful-client" in installed and "httpx" in installed
    assert installed & SERVER_DISTRIBUTIONS == set()

    def imports(module: str) -> bool:
        return subprocess.run([python, "-c", f"import {module}"], cwd=tmp_path, capture_output=True).returncode == 0

    assert imports("brimful_client")
    for module in ("api", "batcher", "workers", "schemas", "brimful"):
        assert not imports(module), f"`import {module}` works in a client-only venv"


def test_the_server_wheel_installs_nothing_but_brimful(tmp_path: Path) -> None:
    sources = copy_sources(tmp_path / "src", ("pyproject.toml", "README.md", "LICENSE", *SERVER_FOLDERS))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(sources),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("brimful-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"brimful"}
    for folder in SERVER_FOLDERS[1:]:
        assert f"brimful/{folder}/__init__.py" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
