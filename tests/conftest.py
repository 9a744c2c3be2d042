"""Fixtures: a real redis-server, the generated test site and the docs.python.org mirror.

The tests are in tiers, one folder each, marked with the folder's name (``pytest -m unit``):

* ``unit``: no Redis, no process (codec, settings, layers, views of literal snapshots...);
* ``lua``: a real redis-server, the scripts called through the frontier call or their admin
  calls (contract tests of each step: lua/test_step_contracts.py);
* ``worker``: one Scrapy crawl in-process, or one worker or command process;
* ``e2e``: several processes, SIGKILL, Redis deployments, the demo, packaging.

The helpers they share live here, at tests/: this file's fixtures, support.py (processes,
items, the keyspace of a contract test), and the fixtures modules (proxyfixtures.py,
redisdeploy.py, mongoserver.py, mongowire.py, fakemongo.py, proxysite.py), importable from
every tier (tests/ is on sys.path: pytest's "prepend" import mode puts this file's folder
there).  A test module's name is unique across the tiers.

* ``redis_server`` (session): :class:`tests.support.RedisServer` with ``.url``, ``.port``,
  ``.client()``, ``.restart()``.
* ``redis_url`` (function): FLUSHALL, then the URL.
* ``site_server`` (session): a generated 60-page site served in a subprocess;
  ``.start_url`` is ``http://127.0.0.1:PORT/site/``, ``.expected_urls`` the pages a crawl
  scoped to it must yield. Shared by the session: its request log accumulates, so a test
  that inspects the log should start its own server with ``site_factory``.
* ``site_factory`` (function): ``site_factory(root, binds=..., behaviour=...)`` serves any
  directory with its own log, stopped after the test.
* ``pydocs_site`` (session): the mirror ``../shared/sites/docs.python.org`` (skip when
  absent; fail instead when the environment variable CI is set).
* ``worker_env`` (function): :func:`tests.support.isolated_env` for ``tmp_path``.
* ``not_redis`` (function): the port of a real HTTP server (a TCP peer that is not Redis).
* ``mongo_uri`` (session): a real MongoDB server's URI: ``MONGO_URI`` when it is set (a
  ``mongod`` of yours), else SecantusDB's ``secantusd-py`` started for the session
  (tests/mongoserver.py).  Tests use a database of their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (  # tests/ is on sys.path (pytest's rootdir-relative "prepend" import)
    PYDOCS_DIR,
    RedisServer,
    SiteProcess,
    isolated_env,
    start_site,
)

from testsite import generate_site

SITE_PAGES = 60
SITE_LINKS = 5


@pytest.fixture(scope="session")
def mongo_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("MONGO_URI")
    if given:
        yield given
        return
    from mongoserver import SecantusServer

    try:
        server = SecantusServer(tmp_path_factory.mktemp("mongo")).start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server.uri
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    server.start()
    yield server
    server.stop()



#: the password of :func:`acl_users`' users
ACL_PASSWORD = "s3cret-acl"


@pytest.fixture
def acl_users(redis_server: RedisServer, redis_url: str) -> Iterator[Callable[[str, str], str]]:
    """``make(name, rule)`` creates an ACL user of the test's redis-server with *rule*
    (``acl.acl_rule``'s text) and returns its URL; the users are deleted afterwards."""
    admin = redis_server.client()
    made: list[str] = []

    def make(name: str, rule: str) -> str:
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{ACL_PASSWORD}",
                              *rule.split())
        made.append(name)
        return f"redis://{name}:{ACL_PASSWORD}@127.0.0.1:{redis_server.port}/0"

    yield make
    for name in made:
        admin.execute_command("ACL", "DELUSER", name)
    admin.close()

@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.restart()  # a test may have stopped it
    client = redis_server.client()
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def lua_clock(redis_url: str) -> Iterator[Callable[..., None]]:
    """The Lua steps' clock, set by the test (TEST ONLY: lua/test_clock.lua): while the test
    runs, every script built in this process reads Redis TIME plus an offset; the fixture's
    value, ``advance(seconds, client=None)``, moves that clock forward by as much at once on
    *redis_url*'s server (or *client*'s), instead of sleeping while Redis time passes.  Off
    again after the test."""
    import redis

    from scrapy_fleet.keys.crawl import TEST_CLOCK_KEY
    from scrapy_fleet.lua import sources

    client = redis.Redis.from_url(redis_url)
    sources.set_test_clock(TEST_CLOCK_KEY)
    try:
        def advance(seconds: float, other: Any = None) -> None:
            (other or client).incrby(TEST_CLOCK_KEY, round(seconds * 1000))

        yield advance
    finally:
        sources.set_test_clock(None)
        client.close()


@pytest.fixture(scope="session")
def site_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteProcess]:
    root = tmp_path_factory.mktemp("site")
    paths = generate_site(root / "www", SITE_PAGES, SITE_LINKS)
    site = start_site(root / "www", root / "requests.jsonl")
    site.expected_paths = paths
    site.start_path = "/site/"
    yield site
    site.stop()


@pytest.fixture
def site_factory(tmp_path: Path) -> Iterator[Callable[..., SiteProcess]]:
    started: list[SiteProcess] = []

    def factory(root: Path, **kwargs: Any) -> SiteProcess:
        log = tmp_path / f"site-requests-{len(started)}.jsonl"
        site = start_site(root, log, **kwargs)
        started.append(site)
        return site

    yield factory
    for site in started:
        site.stop()


@pytest.fixture(scope="session")
def pydocs_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteProcess]:
    if not (PYDOCS_DIR / "3" / "index.html").is_file():
        message = f"docs.python.org mirror not found at {PYDOCS_DIR}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI is set: the mirror is required)", pytrace=False)
        pytest.skip(message)
    site = start_site(PYDOCS_DIR, tmp_path_factory.mktemp("pydocs") / "requests.jsonl")
    site.start_path = "/3/"
    yield site
    site.stop()


@pytest.fixture
def worker_env(tmp_path: Path) -> dict[str, str]:
    return isolated_env(tmp_path)


TIERS = ("unit", "lua", "worker", "e2e")


def pytest_configure(config: pytest.Config) -> None:
    # `-n 2 --dist loadfile` (make test): pytest-xdist hands out whole files in the order of
    # the collection (see below), not sorted by their number of tests, its default, which
    # sent the many-test unit files first and left the longest crawls (one or two tests a
    # file) to the end, where one pytest worker may run one alone while the other waits
    if getattr(config.option, "loadscopereorder", None) is not None:
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    if hasattr(config, "workerinput"):
        # in a pytest-xdist worker (whose collection the scheduler follows): the slow tiers
        # first (e2e, then worker: files of 5-140 s), the quick ones last (lua, unit: files
        # under 15 s), so that the files left at the end are short and the two pytest
        # workers finish together; a file's tests keep their order (a stable sort)
        rank = {tier: n for n, tier in enumerate(reversed(TIERS))}
        items.sort(key=lambda item: rank.get(item.path.parent.name, len(TIERS)))


def pytest_report_header(config: pytest.Config) -> str:
    mirror = "present" if PYDOCS_DIR.is_dir() else "absent"
    return f"docs.python.org mirror: {mirror} ({PYDOCS_DIR})"


@pytest.fixture
def not_redis() -> Iterator[int]:
    """A real HTTP server on a free loopback port (Python's http.server in a thread): a TCP
    peer that answers, but not in Redis's protocol.  Yields its port."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
