"""Write a deterministic static HTML site for crawl tests and demos.

Layout under ``dest`` (``prefix`` defaults to ``"site"``)::

    <prefix>/index.html          the start page, served as /<prefix>/
    <prefix>/p/<n>.html          pages 0 .. pages-1
    <prefix>/files/notes.txt     a non-HTML file in scope (200, text/plain: no item)
    outside/index.html           a page outside the prefix (a scoped crawl must not reach it)
    robots.txt                   allows everything

Reachability: the pages form a ``k``-ary tree (``k = max(links_per_page, 1)``): the index
links to pages ``0 .. k-1`` and page ``i`` links to its children ``k*(i+1) .. k*(i+1)+k-1``,
so every page is reachable from the index in about ``log_k(pages)`` steps. Links left over
on a page point to pseudo-random pages (from ``random.Random(seed)``), some with a
``#fragment``. Every page also links back to ``../`` (the index), to a missing page in
scope (404), to ``/outside/`` (200, outside the prefix) and to an external absolute URL
(``http://external.invalid/...``) that a scoped spider must not follow.
"""

from __future__ import annotations

import random
from pathlib import Path

_WORDS = (
    "fleet crawler frontier lease redis worker request response spider item page link "
    "queue scheduler filter bloom token heartbeat host politeness robots cache shard "
    "python scrapy twisted reactor engine pipeline export signal settings addon "
    "alpha beta gamma delta epsilon zeta theta lambda sigma omega"
).split()

EXTERNAL_URL = "http://external.invalid/elsewhere.html"
"""Absolute link present on every page; it must never be requested by a scoped crawl."""


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _page(title: str, headings: list[tuple[str, str]], body: list[str], links: list[str]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title>",
        "<style>body { font-family: sans-serif; }</style>",
        '<script>var notCounted = "script text is not visible";</script>',
        "</head><body>",
    ]
    for (tag, text), para in zip(headings, body, strict=True):
        parts.append(f"<{tag}>{text}</{tag}>")
        parts.append(f"<p>{para}</p>")
    parts.append("<ul>")
    parts.extend(f'<li><a href="{href}">link {n}</a></li>' for n, href in enumerate(links))
    parts.append("</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def generate_site(
    dest: Path, pages: int, links_per_page: int, seed: int = 0, prefix: str = "site"
) -> list[str]:
    """Write the site into ``dest`` and return the in-scope HTML URL paths that answer 200.

    :param dest: output directory (created; existing files with the same names are replaced)
    :param pages: number of pages ``<prefix>/p/<n>.html`` (>= 1)
    :param links_per_page: links from each page to other pages of the site (>= 1)
    :param seed: seed of the pseudo-random extra links and texts; same arguments, same bytes
    :param prefix: first path segment of the site (no slashes)
    :returns: URL paths such as ``["/site/", "/site/p/0.html", ...]``: exactly the pages a
        spider scoped to ``/<prefix>/`` must yield one item for (the non-HTML file, the
        404 link and the outside page are not in it)
    """
    if pages < 1 or links_per_page < 1:
        raise ValueError("pages and links_per_page must be >= 1")
    if not prefix or "/" in prefix:
        raise ValueError(f"prefix must be one path segment, got {prefix!r}")
    rng = random.Random(seed)
    k = links_per_page
    root = Path(dest) / prefix
    (root / "p").mkdir(parents=True, exist_ok=True)
    (root / "files").mkdir(exist_ok=True)
    (Path(dest) / "outside").mkdir(exist_ok=True)

    index_links = [f"p/{i}.html" for i in range(min(k, pages))]
    index_links += ["files/notes.txt", "p/missing.html", "/outside/", EXTERNAL_URL]
    (root / "index.html").write_text(
        _page(
            f"{prefix} index",
            [("h1", f"Index of {prefix}"), ("h2", "Pages")],
            [_text(rng, 30), _text(rng, 10)],
            index_links,
        ),
        encoding="utf-8",
    )
    for i in range(pages):
        children = [c for c in range(k * (i + 1), k * (i + 1) + k) if c < pages]
        links = [f"{c}.html" for c in children]
        while len(links) < k:
            target = rng.randrange(pages)
            fragment = f"#s{rng.randrange(3)}" if target % 3 == 0 else ""
            links.append(f"{target}.html{fragment}")
        links += ["../", "missing.html", "/outside/", EXTERNAL_URL]
        (root / "p" / f"{i}.html").write_text(
            _page(
                f"Page {i}",
                [("h1", f"Page {i}"), ("h2", f"Section {i}.1"), ("h3", f"Detail {i}.1.1")],
                [_text(rng, 40), _text(rng, 25), _text(rng, 15)],
                links,
            ),
            encoding="utf-8",
        )
    (root / "files" / "notes.txt").write_text("plain text, not a page\n", encoding="utf-8")
    (Path(dest) / "outside" / "index.html").write_text(
        _page("Outside", [("h1", "Outside the prefix")], ["must not be crawled"], [f"/{prefix}/"]),
        encoding="utf-8",
    )
    (Path(dest) / "robots.txt").write_text("User-agent: *\nDisallow:\n", encoding="utf-8")
    return [f"/{prefix}/"] + [f"/{prefix}/p/{i}.html" for i in range(pages)]


def positive_int(text: str) -> int:
    """argparse type of the site's sizes (pages, links, workers): an integer >= 1.

    Raises:
        argparse.ArgumentTypeError: *text* is not one.
    """
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value
