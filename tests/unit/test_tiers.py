"""The tests' own layout (tests/conftest.py): every test module in one of the four tier
folders, each name once, and the two light tiers free of what makes a test slow or
machine-dependent: a unit test starts no server and no process, a Lua test no Scrapy
process.  Read from the sources with ``ast`` (nothing is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "lua", "worker", "e2e")

#: fixtures (tests/conftest.py) that start a server or a process, or prepare a worker's
SERVERS = {"redis_server", "redis_url", "site_server", "site_factory", "pydocs_site",
           "worker_env", "mongo_uri", "acl_users"}
#: helpers (tests/support.py) and modules that start Scrapy or command processes
PROCESSES = {"start_worker", "run_scrapy", "subprocess", "cli"}


def modules(tier: str) -> list[Path]:
    return sorted((TESTS / tier).glob("test_*.py"))


def test_every_test_module_is_in_a_tier_and_its_name_is_unique() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders == set(TIERS)
    names = [p.name for tier in TIERS for p in modules(tier)]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def names_used(tree: ast.AST) -> set[str]:
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            used.update(a.asname or a.name for a in node.names)
    return used


def fixtures_of(tree: ast.Module) -> set[str]:
    return {a.arg for node in tree.body if isinstance(node, ast.FunctionDef)
            and node.name.startswith("test_") for a in node.args.args}


@pytest.mark.parametrize("path", modules("unit"), ids=lambda p: p.name)
def test_a_unit_test_starts_no_server_and_no_process(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert fixtures_of(tree) & SERVERS == set()
    assert names_used(tree) & PROCESSES == set()


@pytest.mark.parametrize("path", modules("lua"), ids=lambda p: p.name)
def test_a_lua_test_starts_no_scrapy_process(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert fixtures_of(tree) & (SERVERS - {"redis_url", "redis_server", "acl_users"}) == set()
    assert names_used(tree) & PROCESSES == set()
