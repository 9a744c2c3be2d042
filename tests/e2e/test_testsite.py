"""The generated test site and its server (served in a subprocess, requested over TCP)."""

from __future__ import annotations

import hashlib
import http.client
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit

import pytest
from support import SiteProcess

from testsite import generate_site
from testsite.generate import EXTERNAL_URL

HREF = re.compile(r'<a href="([^"]*)"')


def get(url: str, host_header: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET without following redirects: (status, headers, body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = {"Host": host_header} if host_header else {}
    conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def digest_tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# -- generator -----------------------------------------------------------------------------------


def test_generate_counts_and_layout(tmp_path: Path) -> None:
    paths = generate_site(tmp_path, pages=25, links_per_page=4)
    assert paths[0] == "/site/"
    assert paths[1:] == [f"/site/p/{i}.html" for i in range(25)]
    assert len(list((tmp_path / "site" / "p").glob("*.html"))) == 25
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "outside" / "index.html").is_file()
    page = (tmp_path / "site" / "p" / "3.html").read_text()
    assert "<title>Page 3</title>" in page
    assert "<h1>Page 3</h1>" in page and "<h2>Section 3.1</h2>" in page
    links = HREF.findall(page)
    assert len(links) == 4 + 4  # links_per_page, then ../, missing.html, /outside/, external
    assert EXTERNAL_URL in links and "/outside/" in links and "../" in links


def test_generate_is_deterministic(tmp_path: Path) -> None:
    generate_site(tmp_path / "a", pages=40, links_per_page=6, seed=7)
    generate_site(tmp_path / "b", pages=40, links_per_page=6, seed=7)
    generate_site(tmp_path / "c", pages=40, links_per_page=6, seed=8)
    a, b, c = (digest_tree(tmp_path / n) for n in "abc")
    assert a == b
    assert a.keys() == c.keys() and a != c


@pytest.mark.parametrize(("pages", "links"), [(1, 1), (60, 5), (500, 1), (1000, 10)])
def test_every_page_reachable_from_index(tmp_path: Path, pages: int, links: int) -> None:
    expected = generate_site(tmp_path, pages=pages, links_per_page=links, prefix="docs")
    base = "http://h/"
    scope = base + "docs/"
    seen = {scope}
    queue = [scope]
    other: set[str] = set()
    while queue:
        url = queue.pop()
        rel = urlsplit(url).path.lstrip("/")
        file = tmp_path / rel / "index.html" if rel.endswith("/") else tmp_path / rel
        if not file.is_file():
            other.add(url)
            continue
        if not file.name.endswith(".html"):
            other.add(url)
            continue
        for href in HREF.findall(file.read_text()):
            target = urldefrag(urljoin(url, href))[0]
            if not target.startswith(scope):
                other.add(target)
            elif target not in seen:
                seen.add(target)
                queue.append(target)
    pages_found = {u for u in seen if u not in other}
    assert pages_found == {base.rstrip("/") + p for p in expected}
    assert len(pages_found) == pages + 1
    assert other == {
        scope + "files/notes.txt",  # 200 but not HTML
        scope + "p/missing.html",  # 404
        base + "outside/",  # out of scope
        EXTERNAL_URL,
    }


# -- server --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("www")
    generate_site(root, pages=10, links_per_page=3)
    return root


def test_serves_files_directories_and_errors(site_server: SiteProcess) -> None:
    base = site_server.url
    status, headers, body = get(base + "site/")
    assert status == 200
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert b"<title>site index</title>" in body
    assert get(base + "site/p/2.html?digest=abc")[2].count(b"<title>Page 2</title>") == 1
    status, headers, _ = get(base + "site")
    assert (status, headers["location"]) == (301, "/site/")
    status, headers, _ = get(base + "site/files/notes.txt")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert get(base + "site/p/missing.html")[0] == 404
    assert get(base + "site/../../../etc/passwd")[0] == 404


def test_request_log_and_stats(site_factory: Callable[..., SiteProcess], small_site: Path) -> None:
    site = site_factory(small_site, binds=["127.0.0.1", "127.0.0.2"])
    assert [urlsplit(u).hostname for u in site.urls] == ["127.0.0.1", "127.0.0.2"]
    port = urlsplit(site.url).port
    before = time.time()
    get(site.urls[0] + "site/")
    get(site.urls[1] + "site/p/1.html")
    get(site.urls[1] + "nope.html")
    log = site.requests()
    assert [(r["host"], r["addr"], r["path"], r["status"]) for r in log] == [
        (f"127.0.0.1:{port}", "127.0.0.1", "/site/", 200),
        (f"127.0.0.2:{port}", "127.0.0.2", "/site/p/1.html", 200),
        (f"127.0.0.2:{port}", "127.0.0.2", "/nope.html", 404),
    ]
    assert all(r["concurrent"] == 1 for r in log)
    assert log[0]["t"] >= before - 1 and log[0]["t"] <= log[1]["t"] <= log[2]["t"]
    stats = site.stats()
    assert stats == {"requests": 3, "max_concurrent": {"127.0.0.1": 1, "127.0.0.2": 1}}
    assert len(site.requests()) == 3  # control requests are not logged


def test_delay_does_not_block_other_requests(
    site_factory: Callable[..., SiteProcess], small_site: Path
) -> None:
    delay = 1.5
    behaviour = {"delays": [{"prefix": "/site/p/", "seconds": delay}]}
    site = site_factory(small_site, behaviour=behaviour)
    slow: dict[str, object] = {}

    def fetch_slow() -> None:
        started = time.monotonic()
        slow["status"] = get(site.url + "site/p/1.html")[0]
        slow["elapsed"] = time.monotonic() - started

    thread = threading.Thread(target=fetch_slow)
    thread.start()
    while not site.requests():  # the slow request has arrived
        time.sleep(0.01)
    assert get(site.url + "site/")[0] == 200  # answered while the slow one is held
    assert thread.is_alive()
    thread.join()
    assert slow["status"] == 200
    assert isinstance(slow["elapsed"], float) and slow["elapsed"] >= delay
    log = site.requests()
    assert [(r["path"], r["concurrent"]) for r in log] == [("/site/p/1.html", 1), ("/site/", 2)]


def test_counts_concurrent_requests_per_host(
    site_factory: Callable[..., SiteProcess], small_site: Path
) -> None:
    site = site_factory(
        small_site,
        binds=["127.0.0.1", "127.0.0.2"],
        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 3.0, "host": "127.0.0.1"}]},
    )
    threads = [
        threading.Thread(target=get, args=(site.urls[0] + f"site/p/{i}.html",)) for i in range(4)
    ]
    for t in threads:
        t.start()
    while len(site.requests()) < 4:
        time.sleep(0.01)
    get(site.urls[1] + "site/p/1.html")  # another host: not delayed, counted on its own
    for t in threads:
        t.join()
    log = site.requests()
    assert sorted(r["concurrent"] for r in log if r["addr"] == "127.0.0.1") == [1, 2, 3, 4]
    assert [r["concurrent"] for r in log if r["addr"] == "127.0.0.2"] == [1]
    assert site.stats()["max_concurrent"] == {"127.0.0.1": 4, "127.0.0.2": 1}
    get(site.urls[0] + "site/p/1.html")  # the in-flight count went back down
    assert site.requests()[-1]["concurrent"] == 1


def test_429_with_retry_after_for_first_requests(
    site_factory: Callable[..., SiteProcess], small_site: Path
) -> None:
    site = site_factory(
        small_site,
        behaviour={"failures": [{"prefix": "/site/", "status": 429, "retry_after": 5, "first": 2}]},
    )
    answers = [get(site.url + "site/p/1.html") for _ in range(3)]
    assert [a[0] for a in answers] == [429, 429, 200]
    assert [a[1].get("retry-after") for a in answers] == ["5", "5", None]
    assert [r["status"] for r in site.requests()] == [429, 429, 200]


def test_503_for_a_prefix_and_host_and_runtime_config(
    site_factory: Callable[..., SiteProcess], small_site: Path
) -> None:
    site = site_factory(small_site, binds=["127.0.0.1", "127.0.0.2"])
    assert get(site.urls[1] + "site/p/2.html")[0] == 200
    site.configure({"failures": [{"prefix": "/site/p/", "status": 503, "host": "127.0.0.2"}]})
    for _ in range(3):
        status, headers, _ = get(site.urls[1] + "site/p/2.html")
        assert status == 503 and "retry-after" not in headers
    assert get(site.urls[1] + "site/")[0] == 200  # other prefix
    assert get(site.urls[0] + "site/p/2.html")[0] == 200  # other host
    site.configure({})
    assert get(site.urls[1] + "site/p/2.html")[0] == 200


def test_robots_per_host(site_factory: Callable[..., SiteProcess], small_site: Path) -> None:
    site = site_factory(
        small_site,
        binds=["127.0.0.1", "127.0.0.2", "127.0.0.3"],
        behaviour={
            "robots": {"127.0.0.2": "User-agent: *\nDisallow: /site/p/\nCrawl-delay: 1\n"},
            "robots_status": {"127.0.0.3": 503},
        },
    )
    status, _, body = get(site.urls[0] + "robots.txt")
    assert (status, body) == (200, b"User-agent: *\nDisallow:\n")  # the generated file
    status, _, body = get(site.urls[1] + "robots.txt")
    assert (status, body) == (200, b"User-agent: *\nDisallow: /site/p/\nCrawl-delay: 1\n")
    assert get(site.urls[2] + "robots.txt")[0] == 503


def test_bad_config_is_rejected(site_factory: Callable[..., SiteProcess], small_site: Path) -> None:
    site = site_factory(small_site)
    conn = http.client.HTTPConnection("127.0.0.1", urlsplit(site.url).port, timeout=10)
    conn.request("PUT", "/_testsite/config", body=b'{"delay": []}')
    resp = conn.getresponse()
    assert resp.status == 400 and b"unknown behaviour keys" in resp.read()
    conn.close()


@pytest.mark.parametrize("args", [["--pages", "0"], ["--links", "-1"], ["--pages", "x"]])
def test_generate_refuses_sizes_below_one_with_a_usage_error(tmp_path, args):
    """A fresh-user trial: --pages 0 ended in a ValueError traceback."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "testsite", "generate",
                             str(tmp_path / "s"), *args], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 2
    assert "expected an integer >= 1" in result.stderr and "Traceback" not in result.stderr
