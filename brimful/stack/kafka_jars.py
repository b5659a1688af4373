"""Apache Kafka's broker as jars from Maven Central, fetched once per version and cached.

The broker is the artifact ``org.apache.kafka:kafka_2.13`` (main class ``kafka.Kafka``)
with its runtime dependencies, and a logging backend for its slf4j logs (the broker's own
jars carry none: without one it logs nothing). Maven resolves them from a pom naming that one dependency
(``mvn dependency:copy-dependencies``) into ``{cache}/{version}/libs``; a fetch that did
not finish leaves no ``libs`` behind, so the next one starts over. The cache is
``BRIMFUL_KAFKA_CACHE``, else ``~/.cache/brimful/kafka``. Needs ``java`` (17 or later: Kafka
4.x requires it) and ``mvn`` on PATH.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from brimful.stack.processes import StackError

# The versions the tests run: the 3.9 line that docker-compose pins, and the current 4.x.
KAFKA_VERSIONS = ("3.9.1", "4.4.0")
DEFAULT_KAFKA_VERSION = KAFKA_VERSIONS[-1]
FETCH_TIMEOUT_S = 600.0

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>brimful.local</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>1.7.36</version>
    </dependency>
  </dependencies>
</project>
"""


def kafka_cache() -> Path:
    """Where fetched broker versions are kept."""
    configured = os.environ.get("BRIMFUL_KAFKA_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "brimful" / "kafka"


def broker_classpath(version: str, cache: Path | None = None) -> str:
    """The java classpath of Kafka ``version``'s broker, fetching its jars first if they
    are not cached. Raises StackError when Java or Maven is missing or the fetch fails."""
    libs = _fetched(version, cache or kafka_cache())
    return str(libs / "*")


def _fetched(version: str, cache: Path) -> Path:
    home = cache / version
    libs = home / "libs"
    if libs.is_dir():
        return libs
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise StackError(f"Apache Kafka's broker needs `{tool}` on PATH (Debian: openjdk-17-jre-headless, maven)")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:  # two fetches of one version: the second waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not libs.is_dir():
            _fetch(version, home, libs)
    return libs


def _fetch(version: str, home: Path, libs: Path) -> None:
    with tempfile.TemporaryDirectory(dir=home) as scratch:
        (Path(scratch) / "pom.xml").write_text(_POM.format(version=version), encoding="utf-8")
        try:
            done = subprocess.run(
                ["mvn", "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={scratch}/libs"],
                cwd=scratch,
                capture_output=True,
                timeout=FETCH_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise StackError(f"fetching Kafka {version} from Maven took over {FETCH_TIMEOUT_S:g} s") from error
        if done.returncode != 0 or not any(Path(scratch, "libs").glob(f"kafka_2.13-{version}.jar")):
            printed = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
            raise StackError(f"Maven could not fetch Kafka {version}'s broker:\n{printed}")
        Path(scratch, "libs").rename(libs)  # whole, or not at all
