"""The example project's ``docs`` spider, offline: scope, items, link filtering."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse, Response, TextResponse
from support import EXAMPLE_PROJECT

sys.path.insert(0, str(EXAMPLE_PROJECT))

from example_project.spiders.docs import DocsSpider, directory_of

from testsite import generate_site

PAGE = """<!DOCTYPE html>
<html><head><title>  os — Miscellaneous
 operating system interfaces </title>
<style>.x { color: red }</style><script>var hidden = "not counted here";</script></head>
<body>
<h1>os — Miscellaneous interfaces<a class="headerlink" href="#module-os">¶</a></h1>
<p>Three words here.</p>
<h2>File   Names</h2><h4>not a heading we keep</h4>
<div><h3>Process <em>Parameters</em></h3><noscript>no script text</noscript></div>
<p>Five more visible words now.</p>
<h2>  </h2>
<a href="os.path.html">same dir</a>
<a href="os.path.html#section">same page again, with a fragment</a>
<a href="../tutorial/index.html">sibling dir</a>
<a href="#module-os">this page</a>
<a href="../index.html">scope index file</a>
<a href="/3/">scope root</a>
<a href="/2/library/os.html">other version</a>
<a href="/3.12/">prefix look-alike</a>
<a href="https://docs.python.org/3/library/os.html">absolute, other host</a>
<a href="http://127.0.0.1:8000/3/glossary.html">absolute, same host, in scope</a>
<a href="mailto:docs@python.org">mail</a>
<a href="javascript:void(0)">js</a>
<a href="../_images/logo.png">image in scope</a>
</body></html>
"""


def html_response(url: str, body: str, meta: dict | None = None) -> HtmlResponse:
    return HtmlResponse(
        url=url,
        body=body.encode("utf-8"),
        encoding="utf-8",
        headers={"Content-Type": "text/html; charset=utf-8"},
        request=Request(url, meta=meta or {}),
    )


def run_parse(response: Response) -> tuple[list[dict], list[Request]]:
    out = list(DocsSpider().parse(response))
    items = [o for o in out if isinstance(o, dict)]
    requests = [o for o in out if isinstance(o, Request)]
    assert len(items) + len(requests) == len(out)
    return items, requests


@pytest.mark.parametrize(
    ("url", "scope"),
    [
        ("http://h/3/", "http://h/3/"),
        ("http://h/site/index.html", "http://h/site/"),
        ("http://h:8000/3/library/os.html?x=1#frag", "http://h:8000/3/library/"),
        ("http://h", "http://h/"),
        ("https://h/a/b/", "https://h/a/b/"),
    ],
)
def test_directory_of(url: str, scope: str) -> None:
    assert directory_of(url) == scope


def test_start_page_scope_is_its_directory() -> None:
    start = "http://127.0.0.1:8000/3/index.html"
    _, requests = run_parse(html_response(start, '<a href="library/">x</a><a href="/2/">y</a>'))
    assert [r.url for r in requests] == ["http://127.0.0.1:8000/3/library/"]
    assert requests[0].meta["scope"] == "http://127.0.0.1:8000/3/"


def test_item_fields() -> None:
    url = "http://127.0.0.1:8000/3/library/os.html"
    before = datetime.now(timezone.utc)
    items, _ = run_parse(html_response(url, PAGE, meta={"scope": "http://127.0.0.1:8000/3/"}))
    assert len(items) == 1
    item = items[0]
    assert set(item) == {"url", "title", "headings", "word_count", "fetched_at"}
    assert item["url"] == url
    assert item["title"] == "os — Miscellaneous operating system interfaces"
    assert item["headings"] == [
        "os — Miscellaneous interfaces",
        "File Names",
        "Process Parameters",
    ]
    # visible body text only: headings, paragraphs, link texts; no script/style/noscript
    body_words = (
        "os Miscellaneous interfaces Three words here File Names not a heading we keep "
        "Process Parameters Five more visible words now "
        "same dir same page again with a fragment sibling dir this page scope index file "
        "scope root other version prefix look alike absolute other host absolute same host "
        "in scope mail js image in scope"
    )
    assert item["word_count"] == len(body_words.split())
    fetched = datetime.fromisoformat(item["fetched_at"])
    assert fetched.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= fetched <= datetime.now(timezone.utc)


def test_link_filtering_keeps_scope_and_drops_fragments_and_duplicates() -> None:
    scope = "http://127.0.0.1:8000/3/"
    url = scope + "library/os.html"
    _, requests = run_parse(html_response(url, PAGE, meta={"scope": scope}))
    assert [r.url for r in requests] == [
        url,  # the h1's "#module-os": the page itself (the dupefilter drops it), once
        scope + "library/os.path.html",
        scope + "tutorial/index.html",
        scope + "index.html",
        scope,
        scope + "glossary.html",
        scope + "_images/logo.png",  # in scope; parse skips it as non-HTML
    ]
    for request in requests:
        assert request.meta == {"scope": scope}
        assert request.callback is None  # parse
        assert all(isinstance(v, str) for v in request.meta.values())


def test_page_outside_scope_after_redirect_is_skipped() -> None:
    response = html_response(
        "http://127.0.0.1:8000/2/library/os.html", PAGE, meta={"scope": "http://127.0.0.1:8000/3/"}
    )
    assert run_parse(response) == ([], [])


def test_non_html_responses_give_nothing() -> None:
    url = "http://h/3/_images/logo.png"
    meta = {"scope": "http://h/3/"}
    png = Response(
        url, body=b"\x89PNG", headers={"Content-Type": "image/png"}, request=Request(url, meta=meta)
    )
    assert run_parse(png) == ([], [])
    text = TextResponse(
        "http://h/3/notes.txt",
        body=b'<a href="x.html">x</a>',
        encoding="utf-8",
        headers={"Content-Type": "text/plain"},
        request=Request("http://h/3/notes.txt", meta=meta),
    )
    assert run_parse(text) == ([], [])


def test_generated_page(tmp_path: Path) -> None:
    generate_site(tmp_path, pages=30, links_per_page=4)
    scope = "http://127.0.0.1:9/site/"
    body = (tmp_path / "site" / "p" / "2.html").read_text()
    items, requests = run_parse(html_response(scope + "p/2.html", body, meta={"scope": scope}))
    assert items[0]["title"] == "Page 2"
    assert items[0]["headings"] == ["Page 2", "Section 2.1", "Detail 2.1.1"]
    # \w+ words: "Page 2", "Section 2 1", "Detail 2 1 1", the texts, "link N" x 8
    assert items[0]["word_count"] == 2 + 40 + 3 + 25 + 4 + 15 + 2 * 8
    urls = [r.url for r in requests]
    assert urls[:4] == [scope + f"p/{c}.html" for c in (12, 13, 14, 15)]  # children of page 2
    assert scope in urls and scope + "p/missing.html" in urls
    assert not any("outside" in u or "external" in u for u in urls)
