"""The README documents every setting, under the environment variable that sets it."""

from __future__ import annotations

from pathlib import Path

from brimful.settings import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_in_the_readme_with_its_default() -> None:
    for name, field in Settings.model_fields.items():
        row = next((line for line in README.splitlines() if line.startswith(f"| `BRIMFUL_{name.upper()}` ")), None)
        assert row is not None, f"README lacks BRIMFUL_{name.upper()}"
        assert f"| `{field.default}` |" in row, f"README shows a stale default for {name}"
