"""Run a plain Triton server on a model repository, using the ``tritonserver`` binary that
the ``nvidia-pytriton`` wheel bundles (with its Python backend).

``python -m brimful.model_server.repository_server --model-repository deploy/triton/models`` serves
the production repository exactly as NVIDIA's Triton image would; docker-compose uses
it, and the tests load the production repository with it. The process replaces itself
with ``tritonserver`` (exec), so signals reach the server directly.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from brimful.model_server.library_path import library_path


def _pytriton_root() -> Path:
    import pytriton

    return Path(pytriton.__file__).parent


def prepare_server(destination: Path) -> Path:
    """Lay out the bundled server (binary, backends, caches) with the Python-backend
    stub for this interpreter; return the ``tritonserver`` binary."""
    source = _pytriton_root() / "tritonserver"
    for part in ("bin", "backends", "caches"):
        shutil.copytree(source / part, destination / part, dirs_exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = source / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy(stub, destination / "backends" / "python" / "triton_python_backend_stub")
    return destination / "bin" / "tritonserver"


def server_environment(base: dict[str, str]) -> dict[str, str]:
    """The environment the bundled server needs: its vendored libraries and this
    interpreter's libpython (the stub links it dynamically) on the library path."""
    env = dict(base)
    env["LD_LIBRARY_PATH"] = library_path(
        base.get("LD_LIBRARY_PATH", ""), str(_pytriton_root().parent / "nvidia_pytriton.libs")
    )
    # The stub runs model.py with this interpreter's packages (numpy, the project).
    env["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '')}"
    return env


def server_argv(binary: Path, repository: Path, grpc_port: int, http_port: int, metrics_port: int) -> list[str]:
    return [
        str(binary),
        f"--model-repository={repository}",
        f"--backend-directory={binary.parent.parent / 'backends'}",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--metrics-port={metrics_port}",
        "--exit-timeout-secs=5",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--server-dir", type=Path, default=None, help="where to lay out the server (default: a temp dir)"
    )
    args = parser.parse_args()
    server_dir = args.server_dir or Path(tempfile.mkdtemp(prefix="brimful-tritonserver-"))
    binary = prepare_server(server_dir)
    argv = server_argv(binary, args.model_repository.resolve(), args.grpc_port, args.http_port, args.metrics_port)
    os.execve(argv[0], argv, server_environment(dict(os.environ)))


if __name__ == "__main__":
    main()
