"""What a user installs: ``python -m build`` gives an sdist and a wheel; the wheel holds the
package, its Lua scripts, the dashboard's static files, ``py.typed`` and the licence, and
nothing of tests/, bench/, testsite/ or example_project/; installed into a venv of its own it
runs ``scrapy fleet --help`` and finds every Lua script.  Also: the oldest-dependencies
constraints (tox ``oldest``) pin exactly the floors setup.cfg declares.

The build runs once per session (``wheel`` fixture, about 20 s: build isolation installs the
newest setuptools from the package index, as a release build would).
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "scrapy_fleet"


def _tracked(folder: str) -> list[str]:
    """Files of *folder* that git tracks (the tree a clean clone builds from)."""
    out = subprocess.run(["git", "ls-files", folder], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout (the build needs the tracked file list)")
    out = tmp_path_factory.mktemp("dist")
    # The default build: an sdist, then the wheel built from the unpacked sdist (so a stale
    # build/ folder of the checkout cannot leak into it, and the sdist is shown complete).
    result = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO_ROOT)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def test_wheel_holds_the_package_and_nothing_else(dist: Path) -> None:
    wheel = _one(dist, "scrapy_fleet-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    package_files = [n for n in names if ".dist-info/" not in n]

    # every tracked file of the package is in the wheel, and nothing outside it
    expected = set(_tracked("scrapy_fleet"))
    assert set(package_files) == expected
    assert all(n.startswith("scrapy_fleet/") for n in package_files)
    for kind in ("scrapy_fleet/lua/frontier.lua", "scrapy_fleet/py.typed",
                 "scrapy_fleet/monitoring/static/dashboard.js"):
        assert kind in names
    assert len([n for n in names if n.endswith(".lua")]) == len(
        [p for p in expected if p.endswith(".lua")]) > 10
    for outside in ("tests/", "bench/", "testsite/", "example_project/"):
        assert not [n for n in names if n.startswith(outside) or f"/{outside}" in n]

    dist_info = [n for n in names if ".dist-info/" in n]
    licence = [n for n in dist_info if re.search(r"\.dist-info/(licenses/)?LICENSE$", n)]
    assert len(licence) == 1, dist_info
    assert zipfile.ZipFile(wheel).read(licence[0]).decode() == (
        REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    metadata = zipfile.ZipFile(wheel).read(_dist_info_file(dist_info, "METADATA")).decode()
    assert re.search(r"^License(-Expression)?: BSD-3-Clause$", metadata, re.M), metadata[:800]
    assert f"Requires-Python: {_setup_cfg()['options']['python_requires']}" in metadata


def _dist_info_file(dist_info: list[str], name: str) -> str:
    return next(n for n in dist_info if n.endswith(f".dist-info/{name}"))


def test_sdist_holds_the_package_data_and_the_licence(dist: Path) -> None:
    sdist = _one(dist, "scrapy_fleet-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "setup.cfg", "pyproject.toml", "README.md"} <= names
    assert set(_tracked("scrapy_fleet")) <= names
    assert not [n for n in names if n.startswith(("testsite/", "tests/", "bench/"))]
    # every docs/ file README.md links to is in the sdist (a link into docs/ was dead there)
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    linked = {m.split("#", 1)[0] for m in re.findall(r"\]\((docs/[^)\s]+)\)", readme)}
    assert linked and linked <= names


def test_wheel_installed_alone_runs_scrapy_fleet_help(dist: Path, tmp_path: Path) -> None:
    """The wheel in a venv of its own (its dependencies are this environment's, reached by a
    path entry appended after the venv's site-packages, so the checkout's editable install
    cannot answer for it): ``scrapy fleet --help`` works and every Lua script loads."""
    wheel = _one(dist, "scrapy_fleet-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz_test_deps.pth").write_text("\n".join(deps) + "\n", encoding="utf-8")
    # --prefix: the venv's own site-packages and bin/ (same Python version); --ignore-installed:
    # this environment's editable install must not count as the package being there already
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--ignore-installed",
                    "--prefix", str(venv),
                    "--no-deps", "--no-index", "--no-warn-script-location", str(wheel)],
                   check=True, timeout=300)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)  # Scrapy writes under HOME
    where = subprocess.run(
        [str(python), "-c", "import scrapy_fleet, scrapy_fleet.lua.sources as lua, pathlib;"
         "print(scrapy_fleet.__file__);"
         "names = sorted(p.name for p in pathlib.Path(lua.__file__).parent.glob('*.lua'));"
         "print(len(names), all(lua.source(n).strip() for n in names))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    module_file, lua_line = where.stdout.splitlines()
    assert Path(module_file).is_relative_to(venv)
    assert lua_line == f"{len(list((PACKAGE / 'lua').glob('*.lua')))} True"

    # Scrapy itself comes from this environment (no console script in the venv): python -m
    result = subprocess.run([str(python), "-m", "scrapy", "fleet", "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "scrapy fleet" in result.stdout and "push" in result.stdout
    # the console script, run by the venv's Python (pip wrote the installing Python's path in
    # its first line)
    cli = subprocess.run([str(python), str(venv / "bin" / "scrapy-fleet"), "--help"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-2000:]
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([str(python), "-c", "import testsite"], cwd=tmp_path, env=env,
                       check=True, capture_output=True)


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg", encoding="utf-8")
    return cfg


def _floors() -> dict[str, str]:
    """name -> the version after '>=' of each install_requires line of setup.cfg."""
    out = {}
    for line in _setup_cfg()["options"]["install_requires"].split("\n"):
        found = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)", line.strip())
        if found:
            out[found[1].lower().replace("_", "-")] = found[3]
    return out


def test_oldest_constraints_pin_the_floors_of_setup_cfg() -> None:
    pins = {}
    for line in (REPO_ROOT / "constraints" / "oldest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    floors = _floors()
    requires = [r for r in _setup_cfg()["options"]["install_requires"].split("\n") if r.strip()]
    assert floors and len(floors) == len(requires)  # every requirement has a floor
    # each floor pinned, as the same version (2.13 == 2.13.0)
    assert {n: Version(v) for n, v in pins.items() if n in floors} == {
        n: Version(v) for n, v in floors.items()}
