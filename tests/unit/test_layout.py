"""The package's layout: every folder of the package is a package, and no module shares its
name with a folder beside it (issue 9, item 11: ``scripts.py`` beside the data folder
``scripts/`` made setuptools warn at every install, and the name meant two things)."""

from __future__ import annotations

from pathlib import Path

import scrapy_fleet
from scrapy_fleet.lua import sources

PACKAGE = Path(scrapy_fleet.__file__).parent


def folders() -> list[Path]:
    return [p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"]


def test_every_folder_is_a_package() -> None:
    not_packages = [str(p.relative_to(PACKAGE)) for p in folders()
                    if not (p / "__init__.py").exists()]
    assert not_packages == []


def test_no_module_shares_a_name_with_a_folder() -> None:
    clashes = [str(p.relative_to(PACKAGE)) for p in folders()
               if p.with_suffix(".py").exists()]
    assert clashes == []


def test_lua_scripts_are_found_by_the_loader() -> None:
    for name in ("frontier.lua", "politeness.lua", "bloom_add.lua", "seeding.lua"):
        source = sources.source(name)
        assert "redis.call" in source, name
