"""The README is a front door: short, its links live, the licence it names is there."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_fits_on_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_names_a_file_that_exists(page):
    missing = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^(https?:|mailto:|#)", target):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{page.name}: links to missing files: {missing}"


def test_the_readme_links_every_docs_page():
    text = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in text]
    assert not unlinked


def test_the_licence_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"]["text"] == "MIT"
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "the hogwild authors" in licence


def test_the_readme_says_how_to_install_and_test():
    text = (ROOT / "README.md").read_text()
    assert "git clone" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    assert "etcd-server" in text and "Linux only" in text
    command = "python3 -m pytest -q -n 2 tests"  # the README's test command is CI's
    assert command in text and command in (ROOT / ".ci" / "run").read_text()
