"""Browser pages through the fleet: scrapy-playwright with Debian's chromium, real workers.

The page methods of a request travel through the frontier as data (codec extension 2); a
live page cannot; pushed JSON lines carry page methods as objects.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support import TEST_PROJECT, read_items, run_scrapy, start_site, start_worker, tail, wait_all

PageMethod = pytest.importorskip("scrapy_playwright.page").PageMethod


PAGE = """<!doctype html><html><head><title>{name}</title></head><body>
<img src="/pixel.png" alt=""><p>static {name}</p>{links}
<button id="reveal" onclick="var p=document.createElement('p');p.id='revealed';
p.textContent='clicked-{name}';document.body.appendChild(p)">reveal</button>
<script>setTimeout(function(){{var d=document.createElement('div');d.id='inserted';
d.textContent='js-{name}';document.body.appendChild(d);}}, 150);</script>
</body></html>"""


PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


def js_site(root: Path, pages: int) -> None:
    links = "".join(f'<a class="page" href="/p{i}.html">p{i}</a>' for i in range(pages))
    links += '<a class="again" href="/again.html">again</a>'
    (root / "index.html").write_text(PAGE.format(name="index", links=links))
    for i in range(pages):
        (root / f"p{i}.html").write_text(PAGE.format(name=f"p{i}", links=""))
    (root / "again.html").write_text(PAGE.format(name="again", links=""))
    (root / "pixel.png").write_bytes(PIXEL)


ROLES = {
    "all": [{}, {}],
    # a browser fetch pool: the fetch worker renders, the parse worker has no browser
    "stages": [{"FLEET_ROLE": "fetch"}, {"FLEET_ROLE": "parse", "FLEET_PLAYWRIGHT": False}],
}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
@pytest.mark.parametrize("roles", sorted(ROLES))
def test_two_workers_crawl_javascript_pages(tmp_path: Path, redis_url: str,
                                            worker_env: dict[str, str], roles: str) -> None:
    site_root = tmp_path / "site"
    site_root.mkdir()
    js_site(site_root, pages=6)
    site = start_site(site_root, tmp_path / "site.log")
    try:
        start = json.dumps({"url": site.url, "meta": {"playwright": True,
                            "playwright_page_methods": [
                                {"method": "wait_for_selector", "args": ["#inserted"]}]}})
        (tmp_path / "start.jsonl").write_text(start + "\n")
        pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "browser_pages",
                                           "-f", str(tmp_path / "start.jsonl"),
                                           "-s", f"FLEET_REDIS_URL={redis_url}"], worker_env)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        outs = [tmp_path / f"out-{n}.jsonl" for n in range(2)]
        logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
        procs = [start_worker(TEST_PROJECT, "browser_pages",
                              {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1,
                               "FLEET_JSONL_PATH": outs[n], **ROLES[roles][n]},
                              worker_env, logs[n])
                 for n in range(2)]
        codes = wait_all(procs, timeout=240)
        assert codes == [0, 0], tail(logs[0]) + tail(logs[1])
    finally:
        site.stop()
    found = read_items(outs)
    items = {item["url"].rsplit("/", 1)[-1] or "index": item for item in found}
    names = ["index", "again.html"] + [f"p{i}.html" for i in range(6)]
    assert sorted(items) == sorted(names)
    assert len(found) == len(names)  # each page once (no worker was killed)
    for name, item in items.items():
        bare = name.removesuffix(".html")
        assert item["browser"] is True, item
        assert item["inserted"] == f"js-{bare}", item  # text JavaScript inserted
    for i in range(6):  # the click of a PageMethod that travelled through the frontier ran
        item = items[f"p{i}.html"]
        assert item["revealed"] == f"clicked-p{i}", item
        assert item["methods"] == ["wait_for_selector", "click", "wait_for_selector"]
    assert items["again.html"]["methods"] == ["wait_for_selector"]  # meta=response.meta
    worker_logs = "".join(tail(path, 200_000) for path in logs)
    aborted = sum(int(n) for n in re.findall(r"'playwright/request_count/aborted': (\d+)",
                                             worker_logs))
    assert aborted == len(names)  # every page's image, none fetched
    fetched = [r["path"] for r in site.requests()]
    assert "/pixel.png" not in fetched
    assert "encode_error" not in worker_logs
    if roles == "stages":  # every page rendered by the fetch worker, parsed by the other
        assert {item["stored"] for item in found} == {True}
        assert "Launching browser" in tail(logs[0], 200_000)
        assert "Launching browser" not in tail(logs[1], 200_000)  # no browser to parse
