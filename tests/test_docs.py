"""The docs stay true to the code: every setting is in docs/configuration.md with its default, every
file a doc names exists, and docs/architecture.md names every room."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from brimful.core.settings import Settings
from tests.helpers.rooms import PACKAGES

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
DOCS = [ROOT / "README.md", ROOT / "client" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def named_paths(text: str) -> list[str]:
    """Repository paths written in backticks (``api/app.py``, ``deploy/triton/models``);
    routes, URLs, keys and patterns are not paths."""
    return [
        token
        for token in re.findall(r"`([^`\s]+)`", text)
        if "/" in token and not token.startswith(("/", "http", ".")) and not re.search(r"[{}:<>*=$|]", token)
    ]


def test_every_setting_is_in_the_configuration_page_with_its_default() -> None:
    for name, field in Settings.model_fields.items():
        row = next(
            (line for line in CONFIGURATION.splitlines() if line.startswith(f"| `BRIMFUL_{name.upper()}` ")), None
        )
        assert row is not None, f"docs/configuration.md lacks BRIMFUL_{name.upper()}"
        assert f"| `{field.default}` |" in row, f"docs/configuration.md shows a stale default for {name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_file_a_doc_names_exists(doc: Path) -> None:
    missing = [path for path in named_paths(doc.read_text()) if not (ROOT / path).exists()]
    assert missing == [], f"{doc.relative_to(ROOT)} names files that do not exist"


def test_the_path_finder_sees_paths_and_only_paths() -> None:
    text = "see `api/app.py`, `deploy/triton/models`, `/v1/tasks`, `brimful:task:{id}` and `a/nope.py`"
    assert named_paths(text) == ["api/app.py", "deploy/triton/models", "a/nope.py"]


def test_architecture_names_every_room_and_the_path_of_a_task() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    for folder in PACKAGES:
        assert f"`{folder}/`" in text, f"docs/architecture.md does not describe {folder}/"
    path_section = text.split("## The path of one task_id", 1)[1]
    stops = re.findall(r"^\d+\. `([^`]+)`", path_section, flags=re.M)
    assert all((ROOT / stop).is_file() for stop in stops)
    # Every room a task crosses has its stop: the front door, the batcher, the GPU side, the core.
    assert {stop.split("/")[0] for stop in stops} >= {"api", "batcher", "workers", "core"}


def test_the_path_of_a_task_names_as_many_files_as_it_says_it_crosses() -> None:
    """The numbered steps name each file the task crosses (scripts/task-path measures them)
    once, and the count above them is theirs; every file named exists."""
    path_section = (ROOT / "docs" / "architecture.md").read_text().split("## The path of one task_id", 1)[1]
    stated = int(re.search(r"crosses \*\*(\d+) of Brimful's Python files\*\*", path_section).group(1))
    steps = re.search(r"^1\. .*?(?=\n\n)", path_section, flags=re.M | re.S).group(0)
    named = re.findall(r"`([a-z_]+/[\w/]+\.py)`", steps)
    assert len(named) == len(set(named)), "a file is named twice in the steps"
    assert len(named) == stated
    assert [name for name in named if not (ROOT / name).is_file()] == []


def test_every_module_the_api_table_names_is_in_its_sub_package() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(api/\w+/)` \| (.*) \|$", text, flags=re.M)
    assert {folder for folder, _ in rows} == {
        f"api/{path.parent.name}/" for path in (ROOT / "api").glob("*/__init__.py")
    }
    for folder, cell in rows:
        named = re.findall(r"`(\w+\.py)`", cell)
        assert named, f"docs/architecture.md names no module of {folder}"
        missing = [name for name in named if not (ROOT / folder / name).is_file()]
        assert missing == [], f"docs/architecture.md names modules {folder} does not hold"


def test_the_readme_is_a_front_page() -> None:
    # What it is, the two commands, a tour and links; the rest lives in docs/.
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make up" in readme and "make test" in readme
