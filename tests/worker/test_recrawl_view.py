"""The recrawl as a person looks at it (recrawl/view.py, docs/recrawl.md "Looking at a host, a
page") after a short adaptive recrawl with a real worker against the changing test site:
``status --hosts --json`` gives the host's tracked pages, learned change rate and price as its
budget HASH holds them, and ``recrawl CRAWL URL`` gives each scheduled page's due time,
history, estimate and last outcome as its record holds them; bad input gets one line and its
exit status."""

from __future__ import annotations

import json
import subprocess
import sys

import redis
from support import wait_until
from test_recrawl import KEYS, site_with, stop, tracked_states, worker

from scrapy_fleet import codec
from scrapy_fleet.politeness.hosts import host_key
from scrapy_fleet.recrawl.schedule import estimate_rate

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def slot_due(client: redis.Redis) -> dict[str, float]:
    """URL -> the due time (ms) of the slot its record waits in."""
    out = {}
    for slot, due in client.zrange(KEYS.revisit_index, 0, -1, withscores=True):
        for rec in client.lrange(KEYS.revisit_slot(slot.decode()), 0, -1):
            if rec:
                out[codec.decode_dict(rec.split(b"\t", 2)[2])["url"]] = due
    return out


def test_status_hosts_and_the_page_view_show_what_redis_holds_after_a_recrawl(
        redis_url, tmp_path, site_factory, worker_env):
    # page 0 changes every second, page 1 never (its revisits are answered 304)
    site = site_with(site_factory, tmp_path, {"pages": 2, "static_share": 1.0,
                                              "periods": {"0": 1.0}})
    client = redis.Redis.from_url(redis_url)
    changing, static = site.url + "changing/0.html", site.url + "changing/1.html"
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", FLEET_RECRAWL="adaptive",
                       FLEET_RECRAWL_INTERVAL=4, FLEET_RECRAWL_MIN_INTERVAL=1,
                       FLEET_RECRAWL_MAX_INTERVAL=100)
    try:
        # the site's index and its two pages, each revisited three times
        wait_until(lambda: len(states := tracked_states(client)) == 3
                   and all(len(s.history) >= 3 for s in states.values()), 240,
                   "three revisits of the three pages", interval=0.5)
    finally:
        stop(proc, log)  # its budgets synced at close: Redis holds the final figures
    host = host_key(site.url)  # the fleet's host key (FLEET_HOST_KEY "host": no port)
    budget = client.hgetall(KEYS.revisit_budget(host))
    pages = sum(int(v) for k, v in budget.items() if not k.startswith((b"r", b"mu")))
    rates = sum(float(v) for k, v in budget.items() if k.startswith(b"r"))
    status = cli("--redis", redis_url, "status", "recrawl", "--hosts", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert [r["host"] for r in data["recrawl_hosts"]] == [host]
    row = data["recrawl_hosts"][0]
    for polite in data["hosts"]:  # its politeness row, while it has one, shows the same
        if polite["host"] == host:
            assert {k: polite[k] for k in row} == row
    assert pages == 3, budget
    assert row["recrawl_pages"] == 3
    assert row["recrawl_rate"] == round(rates / pages * 86400, 3) and row["recrawl_rate"] > 0
    mu = budget.get(b"mu")
    assert row["recrawl_priced_out"] is (mu == b"inf")
    assert row["recrawl_price"] == (None if mu in (None, b"inf") else round(float(mu), 3))
    text = cli("--redis", redis_url, "status", "recrawl", "--hosts")
    assert text.returncode == 0, text.stderr
    assert f"{host:<32} {3:>8}" in text.stdout, text.stdout

    states, due = tracked_states(client), slot_due(client)
    shown = {}
    for url in (changing, static):
        result = cli("--redis", redis_url, "recrawl", "recrawl", url, "--json")
        if url not in states:  # queued as a due revisit when the worker stopped
            assert result.returncode == 1, result.stderr
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
            continue
        assert result.returncode == 0, result.stderr
        view, state = json.loads(result.stdout), states[url]
        shown[url] = view
        assert (view["url"], view["host"], view["history"], view["interval"],
                view["last_fetch"], view["visits"]) == (
            url, host, state.history, state.interval, state.fetched, len(state.history) + 1)
        assert view["next_due"] == round(due[url] / 1000, 3)
        assert view["change_rate"] == round(
            estimate_rate(state.history, float(state.interval)) * 86400, 3)
        # the last answer the site logged for the page: a 304 is told from a 2xx
        last = [r["status"] for r in site.requests() if r["path"] == url[len(site.url) - 1:]]
        assert last and last[-1] in (200, 304), last
        assert view["last_outcome"] == ("not_modified" if last[-1] == 304 else "changed"
                                        if state.history[-1] > 0 else "unchanged")
    # the static page waits in the schedule (its interval grew): unchanged at every revisit,
    # answered 304 (its validators sent)
    assert static in shown, (states, due)
    assert shown[static]["last_outcome"] == "not_modified"
    assert all(t < 0 for t in shown[static]["history"])
    if changing in shown:
        assert shown[changing]["change_rate"] > shown[static]["change_rate"]
    text = cli("--redis", redis_url, "recrawl", "recrawl", static)
    assert text.returncode == 0 and "last outcome not_modified (304)" in text.stdout, text.stdout


def test_bad_input_gets_one_line_and_its_exit_status(redis_url):
    pushed = cli("--redis", redis_url, "push", "views", "http://h.test/a")
    assert pushed.returncode == 0, pushed.stderr
    cases = [(("recrawl", "nosuchcrawl", "http://h.test/a"), 4, "nosuchcrawl"),
             (("recrawl", "views", "http://h.test/a"), 1, "not in the recrawl schedule"),
             (("recrawl", "views", "h.test/a"), 2, "one http(s) URL"),
             (("recrawl", "views"), 2, "one http(s) URL"),
             (("recrawl", "views", "http://h.test/a", "http://h.test/b"), 2, "one http(s)")]
    for args, status, words in cases:
        result = cli("--redis", redis_url, *args)
        lines = result.stderr.strip().splitlines()
        assert (result.returncode, len(lines)) == (status, 1), (args, result.stderr)
        assert words in lines[0], (args, lines)
        assert result.stdout == "" and "Traceback" not in result.stderr
