"""``docs``: crawl a static site from a pushed start URL, staying under its directory.

The spider has no ``start_urls``: the start URL is pushed into the fleet's frontier with
``scrapy fleet push docs http://HOST/3/``. The crawl scope is the directory of the first
page (``http://HOST/3/`` for ``http://HOST/3/``, ``http://HOST/site/`` for
``http://HOST/site/index.html``) and travels to the following pages in
``meta["scope"]`` (a plain string: ``meta`` is serialized by the fleet).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urldefrag, urlsplit, urlunsplit

import scrapy
from scrapy.http import Response, TextResponse

_WORD = re.compile(r"\w+")
_VISIBLE_TEXT = (
    "//body//text()[not(ancestor::script) and not(ancestor::style)"
    " and not(ancestor::noscript) and not(ancestor::template)]"
)


def directory_of(url: str) -> str:
    """URL of the directory holding ``url``: path up to its last "/", no query or fragment."""
    parts = urlsplit(url)
    path = parts.path or "/"
    return urlunsplit((parts.scheme, parts.netloc, path[: path.rindex("/") + 1], "", ""))


def is_html(response: Response) -> bool:
    ctype = (response.headers.get(b"Content-Type") or b"").split(b";")[0].strip().lower()
    return isinstance(response, TextResponse) and ctype in (b"text/html", b"application/xhtml+xml")


def clean(text: str) -> str:
    """Collapse whitespace; drop Sphinx's trailing "¶" permalink sign."""
    return " ".join(text.split()).removesuffix("¶").strip()


class DocsSpider(scrapy.Spider):
    name = "docs"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        scope = response.meta.get("scope") or directory_of(response.url)
        if not response.url.startswith(scope) or not is_html(response):
            return  # redirected out of scope, or an image/PDF/text file: no item
        assert isinstance(response, TextResponse)
        yield {
            "url": response.url,
            "title": clean(response.xpath("string(//title)").get(default="")),
            "headings": [
                text
                for h in response.xpath("//h1 | //h2 | //h3")
                if (text := clean(h.xpath("string()").get(default="")))
            ],
            "word_count": len(_WORD.findall(" ".join(response.xpath(_VISIBLE_TEXT).getall()))),
            "fetched_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        }
        seen: set[str] = set()
        for href in response.xpath("//a/@href").getall():
            url = urldefrag(response.urljoin(href.strip()))[0]
            if url.startswith(scope) and url not in seen:
                seen.add(url)
                yield response.follow(url, meta={"scope": scope})  # callback: parse
