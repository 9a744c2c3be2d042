"""The docs.python.org mirror's figures, said in one way wherever they are written: a crawl
from /3/ yields 516 URLs that answer 200 (``support.PYDOCS_PAGES``), its 515 HTML files with
``3/index.html`` both as /3/ and as /3/index.html (shared/sites/SOURCES.md).  README.md said
516 pages while bench/bench_recovery.py said 515."""

from __future__ import annotations

import re

import pytest
from support import PYDOCS_DIR, PYDOCS_PAGES, REPO_ROOT

HTML_FILES = 515
#: a count of pages, URLs or HTML files of the mirror (not a range or a rate: 440-510 pages/s)
FIGURE = re.compile(r"(?<![-\d,.])(51\d) (pages|page URLs|URLs|HTML \w+)(?!/)")
WHERE = ["README.md", "docs/architecture.md", "bench/bench_recovery.py", "bench/README.md"]


@pytest.mark.parametrize("path", WHERE)
def test_the_mirror_is_516_urls_and_515_html_files_wherever_said(path):
    text = " ".join((REPO_ROOT / path).read_text(encoding="utf-8").split())
    for number, what in FIGURE.findall(text):
        expected = HTML_FILES if what.startswith("HTML") else PYDOCS_PAGES
        assert int(number) == expected, f"{path}: {number} {what}"


def test_the_figures_are_the_mirrors():
    html = sorted(p.relative_to(PYDOCS_DIR).as_posix()
                  for p in (PYDOCS_DIR / "3").rglob("*.html")) if PYDOCS_DIR.is_dir() else []
    if not html:
        pytest.skip(f"no docs.python.org mirror at {PYDOCS_DIR}")
    assert len(html) == HTML_FILES
    assert "3/index.html" in html  # reached as /3/ too: one URL more than files
    assert PYDOCS_PAGES == HTML_FILES + 1
