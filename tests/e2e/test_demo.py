"""The demo (example_project/run_demo.py) ends with one verdict line and shows the site's
responses by status, 404s included (issue 9); what the site should yield is found by walking
the served folder with the demo's spider."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from support import EXAMPLE_PROJECT, PYDOCS_DIR, PYDOCS_PAGES

from testsite import generate_site

_spec = importlib.util.spec_from_file_location("run_demo", EXAMPLE_PROJECT / "run_demo.py")
assert _spec is not None and _spec.loader is not None
run_demo = importlib.util.module_from_spec(_spec)
sys.modules["run_demo"] = run_demo  # dataclasses look their module up there
_spec.loader.exec_module(run_demo)

DEMO = [sys.executable, str(EXAMPLE_PROJECT / "run_demo.py")]


def demo(tmp_path, worker_env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEMO, "--dir", str(tmp_path / "demo"), "--workers", "2",
                           "--pages", "30", "--links", "4", "--idle-timeout", "1", *args],
                          env=worker_env, capture_output=True, text=True, timeout=300)


def test_demo_ends_with_ok_and_shows_the_404(tmp_path, worker_env):
    result = demo(tmp_path, worker_env)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[-1] == "OK: 31 pages, each once (1 link answered 404, as the site has them)"
    assert "responses        200: 32, 404: 1 (the site should answer 200: 32, 404: 1)" in lines
    assert "  404            /site/p/missing.html" in lines
    assert "pages            31 unique URLs (the site should yield 31)" in lines


def test_demo_stopped_early_ends_with_failed(tmp_path, worker_env):
    # stopped once both workers run (run_demo waits for their heartbeats), with the site
    # fetched at most 4 pages/s fleet-wide: the 31 pages cannot all be fetched by then
    result = demo(tmp_path, worker_env, "--timeout", "0", "--host-delay", "0.25")
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stdout.splitlines()[-1]
    assert last.startswith("FAILED: "), last
    assert "pages missing" in last or "nothing was crawled" in last, last


def test_walk_of_a_generated_site_finds_its_pages_and_its_broken_link(tmp_path):
    paths = generate_site(tmp_path / "www", 12, 3)
    found = run_demo.site_should_yield(tmp_path / "www", "http://127.0.0.1:1/site/")
    assert found.pages == {f"http://127.0.0.1:1{p}" for p in paths}
    assert found.not_found == ["http://127.0.0.1:1/site/p/missing.html"]
    assert found.statuses[404] == 1


def test_walk_of_the_mirror_finds_516_pages_and_11_broken_links():
    if not (PYDOCS_DIR / "3" / "index.html").is_file():
        message = f"docs.python.org mirror not found at {PYDOCS_DIR}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI is set: the mirror is required)", pytrace=False)
        pytest.skip(message)
    found = run_demo.site_should_yield(PYDOCS_DIR, "http://127.0.0.1:1/3/")
    assert len(found.pages) == PYDOCS_PAGES
    assert len(found.not_found) == 11
    assert "http://127.0.0.1:1/3/whatsnew/changelog.html" in found.not_found
