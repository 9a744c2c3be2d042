"""Issue 31: a revisit changed when what the spider extracts changed.  Real workers revisit
testsite pages that send no validators (every revisit a 200) and whose only change is a
price (a number) or one sentence of a 500-word article; the site logs the version it served
with each 200.  Every changed version fetched reaches the pipeline (items written = changed
versions fetched), a page that does not change writes no new item, at 1 and 4 workers."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis
from support import TEST_PROJECT, read_items, start_worker, tail, wait_all, wait_until

from scrapy_fleet.keys.crawl import CrawlKeys

KEYS = CrawlKeys("fleet", "recrawl")


def versions_served(site: Any) -> dict[str, list[str]]:
    """path -> the versions the site served with a 200, in order."""
    out: dict[str, list[str]] = defaultdict(list)
    for r in site.requests():
        if r.get("version"):
            out[r["path"]].append(r["version"])
    return out


def changed_versions(served: list[str]) -> int:
    """Versions a crawler saw change: the first one, and each one unlike the one before."""
    return sum(1 for k, v in enumerate(served) if k == 0 or v != served[k - 1])


def crawl(tmp_path: Path, site: Any, redis_url: str, env: dict[str, str], workers: int,
          revisits: int, **settings: Any) -> list[dict[str, Any]]:
    """Run *workers* workers until the site served *revisits* 200s to its pages, stop them
    (they drain: every fetched page is handled), return the items they wrote."""
    procs = []
    for n in range(workers):
        log = tmp_path / f"w{n}.log"
        base = {"FLEET_REDIS_URL": redis_url, "FLEET_POLL_INTERVAL": 0.2,
                "FLEET_JSONL_PATH": str(tmp_path / f"items-{n}.jsonl"),
                "FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": 1,
                "FLEET_RECRAWL_IGNORE_FIELDS": "fetched_at", **settings}
        procs.append((start_worker(TEST_PROJECT, "recrawl", base, env, log,
                                   spider_args={"start": site.url + "changing/",
                                                "stamp": "1"}), log))

    def served() -> bool:
        for proc, log in procs:
            assert proc.poll() is None, tail(log)
        return sum(len(v) for v in versions_served(site).values()) >= revisits

    try:
        wait_until(served, 240, f"{revisits} pages served with a 200", interval=0.3)
    finally:
        for proc, _ in procs:
            proc.terminate()  # a recrawl never goes idle: each worker drains and exits 0
        codes = wait_all([p for p, _ in procs], 90)
    assert codes == [0] * workers, [tail(log) for _, log in procs]
    return read_items([tmp_path / f"items-{n}.jsonl" for n in range(workers)])


def check_no_change_missed(site: Any, items: list[dict[str, Any]], static: list[int],
                           changing: list[int]) -> None:
    written: dict[str, int] = defaultdict(int)
    for item in items:
        written[item["url"]] += 1
    served = versions_served(site)
    for i in static + changing:
        path = f"/changing/{i}.html"
        assert written[site.url + path[1:]] == changed_versions(served[path]), (
            path, served[path], written[site.url + path[1:]])
    for i in static:
        path = f"/changing/{i}.html"
        assert len(served[path]) >= 3 and written[site.url + path[1:]] == 1, served[path]
    # the test saw changes: most revisits of the changing pages found a new version
    seen = sum(changed_versions(served[f"/changing/{i}.html"]) - 1 for i in changing)
    assert seen >= 2 * len(changing), seen


@pytest.mark.parametrize("workers", [1, 4])
def test_every_changed_price_reaches_the_pipeline_and_a_static_page_writes_nothing_new(
        redis_url, tmp_path, site_factory, worker_env, workers):
    # pages 0-2 change their price every 2-3 s; pages 3-5 never change; no validators
    spec = {"pages": 6, "static_share": 1.0, "kind": "price", "validators": False,
            "periods": {"0": 2.0, "1": 2.5, "2": 3.0}}
    root = tmp_path / "www"
    root.mkdir()
    site = site_factory(root, behaviour={"changing": spec})
    items = crawl(tmp_path, site, redis_url, worker_env, workers, revisits=60)
    check_no_change_missed(site, items, static=[3, 4, 5], changing=[0, 1, 2])
    # a changed page's items carry the digest compared: one per version
    prices = [i for i in items if i["url"] == site.url + "changing/0.html"]
    assert len({i["fleet_signature"] for i in prices}) == len(prices)
    stats = redis.Redis.from_url(redis_url).hgetall(KEYS.stats)
    assert int(stats.get(b"revisit_unchanged", 0)) >= 3 * 2  # the static pages' revisits


def test_a_one_sentence_edit_of_a_500_word_page_reaches_the_pipeline(
        redis_url, tmp_path, site_factory, worker_env):
    spec = {"pages": 4, "static_share": 1.0, "kind": "edit", "validators": False,
            "periods": {"0": 2.0, "1": 3.0}}
    root = tmp_path / "www"
    root.mkdir()
    site = site_factory(root, behaviour={"changing": spec})
    items = crawl(tmp_path, site, redis_url, worker_env, 1, revisits=40)
    check_no_change_missed(site, items, static=[2, 3], changing=[0, 1])
    article = [i for i in items if i["url"] == site.url + "changing/0.html"]
    assert len(article[0]["text"].split()) >= 500
