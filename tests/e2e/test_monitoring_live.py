"""The cockpit's views on real data: a real redis-server, real ``scrapy crawl`` workers on a
generated site, the real ``scrapy-fleet monitor`` / ``top`` processes, real HTTP requests,
the Prometheus text parsed with prometheus_client.parser, and the dashboard in Debian's
chromium driven by playwright (never ``playwright install``)."""

from __future__ import annotations

import collections
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import (
    EXAMPLE_PROJECT,
    free_port,
    kill_worker,
    read_items,
    run_scrapy,
    start_worker,
    stop_process,
    tail,
    wait_all,
    wait_until,
)

from testsite import generate_site

pytestmark = pytest.mark.slow

SCRAPY_FLEET = str(Path(sys.executable).parent / "scrapy-fleet")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
TITLE = "scrapy-fleet top · crawl docs"  # the first line of each frame of `top docs`
ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][A-Z0-9]|[=>])")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> tuple[int, Any]:
    status, body = get(url)
    return status, json.loads(body)


class Monitor:
    """``scrapy-fleet --redis URL monitor CRAWL --port 0 ...`` in a subprocess."""

    def __init__(self, redis_url: str, crawl: str, env: dict[str, str], *extra: str) -> None:
        self.proc = subprocess.Popen(
            [SCRAPY_FLEET, "--redis", redis_url, "monitor", crawl, "--port", "0",
             "--interval", "1", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"dashboard (http://127\.0\.0\.1:\d+/)", line)
        if not match:
            stop_process(self.proc)
            raise AssertionError(f"monitor did not start: {line!r} "
                                 f"{self.proc.stderr.read() if self.proc.stderr else ''}")
        self.url = match.group(1)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = get(self.url + "metrics")
        assert status == 200
        return samples(body.decode())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)


@pytest.fixture
def monitors() -> Iterator[list[Monitor]]:
    started: list[Monitor] = []
    yield started
    for monitor in started:
        if monitor.proc.poll() is None:
            stop_process(monitor.proc)


def push(redis_url: str, env: dict[str, str], *urls: str, crawl: str = "docs") -> None:
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", crawl, *urls, "-s",
                                          f"FLEET_REDIS_URL={redis_url}"], env)
    assert result.returncode == 0, result.stderr + result.stdout


def test_monitor_exits_2_with_one_line_when_redis_is_unreachable(worker_env):
    port = free_port()
    result = subprocess.run([SCRAPY_FLEET, "--redis", f"redis://127.0.0.1:{port}/0", "monitor",
                             "docs", "--port", "0"], capture_output=True, text=True,
                            env=worker_env, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach Redis at "), lines
    assert f"127.0.0.1:{port}" in lines[0] and result.stdout == ""
    result = subprocess.run([SCRAPY_FLEET, "--redis", f"redis://127.0.0.1:{port}/0", "top",
                             "docs", "--once"], capture_output=True, text=True,
                            env=worker_env, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_monitor_rejects_a_bad_port_and_a_taken_address(redis_url, worker_env, monitors):
    result = subprocess.run([SCRAPY_FLEET, "--redis", redis_url, "monitor", "docs"],
                            capture_output=True, text=True, env=worker_env, timeout=60)
    assert result.returncode == 2 and "monitor needs --port" in result.stderr
    monitors.append(Monitor(redis_url, "docs", worker_env))
    port = monitors[0].url.rsplit(":", 1)[1].strip("/")
    result = subprocess.run([SCRAPY_FLEET, "--redis", redis_url, "monitor", "docs", "--port",
                             port], capture_output=True, text=True, env=worker_env, timeout=60)
    assert result.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_monitor_keeps_serving_while_redis_is_down(redis_server, redis_url, worker_env,
                                                    monitors):
    push(redis_url, worker_env, "http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    monitor = Monitor(redis_url, "docs", worker_env)
    monitors.append(monitor)
    got = monitor.metrics()
    assert got[("scrapy_fleet_up", ())] == 1
    assert got[("scrapy_fleet_frontier_requests", (("state", "due"),))] == 2
    assert got[("scrapy_fleet_requests_total", (("event", "pushed"),))] == 2
    status, snap = get_json(monitor.url + "api/snapshot")
    assert status == 200 and snap["frontier"]["due"] == 2 and snap["crawl"] == "docs"

    redis_server.stop()
    try:
        got = monitor.metrics()
        assert got[("scrapy_fleet_up", ())] == 0
        assert got[("scrapy_fleet_scrape_errors_total", ())] >= 1
        assert ("scrapy_fleet_frontier_requests", (("state", "due"),)) not in got
        status, reply = get_json(monitor.url + "api/snapshot")
        assert status == 503 and reply["error"].startswith("cannot read Redis")
        assert reply["last_snapshot"]["frontier"]["due"] == 2
        assert reply["error_since"] is not None
        assert get(monitor.url + "api/series?name=depth_due")[0] == 503
        assert get(monitor.url)[0] == 200
        assert monitor.proc.poll() is None
    finally:
        redis_server.restart()
    push(redis_url, worker_env, "http://127.0.0.1:9/c")  # the restarted Redis is empty
    got = monitor.metrics()
    assert got[("scrapy_fleet_up", ())] == 1
    assert got[("scrapy_fleet_frontier_requests", (("state", "due"),))] == 1
    assert monitor.stop() == 0  # SIGTERM: a clean exit


def _read_pty(fd: int, until: float, need: tuple[str, ...], times: int = 1) -> str:
    """The pty's text (ANSI codes taken out) once each of *need* is in it *times* times, or
    what came until *until* (or the end of the stream)."""
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            text = ANSI.sub("", out.decode(errors="replace"))
            if all(text.count(n) >= times for n in need):
                return text
    return ANSI.sub("", out.decode(errors="replace"))


def _drain_until_exit(fd: int, proc: subprocess.Popen[bytes], until: float) -> str:
    """Read the pty like a terminal until *proc* exits (or *until*), then what is left.

    ``top`` writes its last frame on its way out; into a pty nobody reads (its buffer holds
    some 24 KiB here, a few frames behind on a loaded machine) that write blocks for ever,
    and the Ctrl-C looked ignored."""
    out = b""
    while proc.poll() is None and time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:  # EIO: every writer of the pty has closed it
                break
    if proc.poll() is None:
        try:
            proc.wait(max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    return ANSI.sub("", out.decode(errors="replace")) + _read_pty(
        fd, time.monotonic() + 2, ("\x00",))


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT at its default and not blocked, as a shell gives a
    command it starts; a process inheriting it ignored (a suite started in the background of a
    non-interactive shell) or blocked keeps it so.  (Two background suite runs saw top not exit
    within 15 s of Ctrl-C; not reproduced alone, foreground or background.)"""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextmanager
def _top_in_pty(redis_url: str, worker_env: dict[str, str],
                interval: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``scrapy-fleet top docs --interval INTERVAL`` in a pseudo-terminal of 120 x 40:
    (the process, the pty's master fd); killed if still running, the fd closed, after."""
    env = dict(worker_env, TERM="xterm-256color", COLUMNS="120", LINES="40")
    master, slave = pty.openpty()
    proc = subprocess.Popen([SCRAPY_FLEET, "--redis", redis_url, "top", "docs", "--interval",
                             interval], stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    os.close(slave)
    try:
        yield proc, master
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_top_in_a_pseudo_terminal_redraws_and_exits_on_ctrl_c(redis_url, worker_env):
    push(redis_url, worker_env, "http://127.0.0.1:9/a", "http://127.0.0.1:9/b",
         "http://127.0.0.1:9/c")
    with _top_in_pty(redis_url, worker_env, "0.3") as (proc, master):
        # a frame is drawn whole once the next one begins (it ends with its alerts: here
        # "no worker is alive", not "alerts: none"; waiting for the word "alerts" waited out
        # the 30 s)
        text = _read_pty(master, time.monotonic() + 30, (TITLE,), times=2)
        assert "scrapy-fleet top · crawl docs" in text, text
        due = [line for line in text.splitlines() if line.strip().startswith("due")]
        assert due and due[-1].split()[1] == "3", text
        assert "workers alive 0 of 0" in text and "(no worker)" in text
        # it redraws: a push shows up without restarting it
        push(redis_url, worker_env, "http://127.0.0.1:9/d")
        deadline = time.monotonic() + 20
        seen = ""
        while time.monotonic() < deadline:
            seen += _read_pty(master, time.monotonic() + 1, ("\x00",))
            rows = [line for line in seen.splitlines() if line.strip().startswith("due")]
            if rows and rows[-1].split()[1] == "4":
                break
        else:
            raise AssertionError("top did not redraw with the new depth:\n" + seen[-2000:])
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        rest = _drain_until_exit(master, proc, time.monotonic() + 15)
        assert proc.poll() == 0, rest[-2000:]
        assert "Traceback" not in seen + rest


def _read_raw(fd: int, until: float, need: bytes = b"", times: int = 1) -> bytes:
    """Bytes from *fd* until *until*, the end of the stream, or *need* is among them *times*
    times."""
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every writer of the pty has closed it
                break
            if not chunk:
                break
            out += chunk
            if need and out.count(need) >= times:
                break
    return out


def _sigterm_and_drain(proc: subprocess.Popen[bytes], fd: int) -> bytes:
    """SIGTERM *proc*, then what it writes to the pty *fd* until it exits (15 s at most)
    and one more second."""
    proc.send_signal(signal.SIGTERM)
    out = b""
    deadline = time.monotonic() + 15
    while proc.poll() is None and time.monotonic() < deadline:
        out += _read_raw(fd, time.monotonic() + 0.5)
    return out + _read_raw(fd, time.monotonic() + 1)


def test_top_in_a_pseudo_terminal_exits_0_on_sigterm_with_the_terminal_restored(
        redis_url, worker_env):
    # issue 19: SIGTERM left exit status 143 and the alternate screen on
    push(redis_url, worker_env, "http://127.0.0.1:9/a")
    with _top_in_pty(redis_url, worker_env, "1") as (proc, master):
        # the second frame begun (waiting for the word "alerts", which a frame with an alert
        # does not show, waited out the 30 s), then read whole: top waits between frames
        raw = _read_raw(master, time.monotonic() + 30, TITLE.encode(), times=2)
        while chunk := _read_raw(master, time.monotonic() + 0.3):
            raw += chunk
        assert b"\x1b[?1049h" in raw, raw[-2000:]  # on the alternate screen
        out = _sigterm_and_drain(proc, master)
        assert proc.poll() == 0, out[-2000:]
        assert b"\x1b[?1049l" in out, out[-2000:]  # the alternate screen left
        assert b"Traceback" not in raw + out


def test_top_in_a_pseudo_terminal_restores_the_terminal_on_sigterm_mid_frame(redis_url,
                                                                             worker_env):
    # a SIGTERM that lands while a frame is being written (here: frames drawn back to back)
    # left the alternate screen on in 2 of 4 tries: the signals are held while a frame is
    # written (monitoring/top.py)
    push(redis_url, worker_env, "http://127.0.0.1:9/a")
    for _ in range(4):
        with _top_in_pty(redis_url, worker_env, "0.001") as (proc, master):
            raw = _read_raw(master, time.monotonic() + 30, TITLE.encode(), times=5)
            assert raw.count(TITLE.encode()) >= 5, raw[-2000:]
            out = _sigterm_and_drain(proc, master)
            assert proc.poll() == 0, out[-2000:]
            # the alternate screen left, last: nothing drawn after it
            assert b"\x1b[?1049l" in out, out[-2000:]
            assert b"\x1b[?1049h" not in out.rsplit(b"\x1b[?1049l", 1)[1], out[-2000:]
            assert b"Traceback" not in raw + out


def test_top_piped_prints_each_frame_as_it_is_drawn_and_exits_0_on_sigterm(redis_url,
                                                                          worker_env):
    # issue 19: `top --interval 1 | cat` printed nothing while it ran and lost it all on
    # SIGTERM (exit 143): each frame now comes out, flushed, as it is drawn
    push(redis_url, worker_env, "http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    proc = subprocess.Popen([SCRAPY_FLEET, "--redis", redis_url, "top", "docs", "--interval",
                             "0.3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=worker_env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        fd = proc.stdout.fileno()
        out = b""
        deadline = time.monotonic() + 30
        while out.count(b"scrapy-fleet top \xc2\xb7 crawl docs") < 2 and \
                time.monotonic() < deadline:
            out += _read_raw(fd, time.monotonic() + 1)
        assert proc.poll() is None  # frames arrive while it runs
        assert out.count(b"scrapy-fleet top \xc2\xb7 crawl docs") >= 2, out[-2000:]
        assert b"\x1b[?1049h" not in out  # no alternate screen in a pipe
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        rest = proc.stdout.read()
        assert b"Traceback" not in out + rest + proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_scrapy_fleet_top_once_inside_the_project(redis_url, worker_env):
    push(redis_url, worker_env, "http://127.0.0.1:9/a")
    env = {k: v for k, v in worker_env.items() if k != "COLUMNS"}  # a pipe, no width given
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", "top", "docs", "--once", "-s",
                                          f"FLEET_REDIS_URL={redis_url}"], env)
    assert result.returncode == 0, result.stderr
    assert "scrapy-fleet top · crawl docs" in result.stdout
    # wide enough for whole headers and one line of totals (80 columns cut and wrapped them)
    lines = result.stdout.splitlines()
    assert any(line.split() == ["worker", "state", "health", "leases", "downloads", "pages",
                                "items", "errors", "last", "seen"] for line in lines), lines
    assert any("2xx" in line and "5xx" in line for line in lines), lines
    due = [line for line in result.stdout.splitlines() if line.strip().startswith("due")]
    assert due[0].split()[1] == "1"


# -- a real crawl --------------------------------------------------------------------------


def start_fleet(tmp_path: Path, redis_url: str, env: dict[str, str], workers: int,
                settings: dict[str, Any]) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    logs = [tmp_path / f"worker-{n}.log" for n in range(workers)]
    procs = [start_worker(EXAMPLE_PROJECT, "docs", {"FLEET_REDIS_URL": redis_url,
                                                    "FLEET_JSONL_PATH": tmp_path / f"out-{n}.jsonl",
                                                    **settings}, env, logs[n])
             for n in range(workers)]
    return procs, logs


def test_metrics_are_exact_after_a_crawl_with_403s(redis_url, site_factory, worker_env,
                                                   tmp_path, monitors):
    generate_site(tmp_path / "www", 60, 5)
    site = site_factory(tmp_path / "www",
                        behaviour={"failures": [{"prefix": "/site/p/1", "status": 403}]})
    push(redis_url, worker_env, site.url + "site/")
    monitor = Monitor(redis_url, "docs", worker_env)
    monitors.append(monitor)
    procs, logs = start_fleet(tmp_path, redis_url, worker_env, 2, {"FLEET_IDLE_TIMEOUT": 1})
    for n, code in enumerate(wait_all(procs, 180)):
        assert code == 0, tail(logs[n])
    log = [r for r in site.requests() if r["path"] != "/robots.txt"]
    by_class = collections.Counter(f"{r['status'] // 100}xx" for r in log)
    forbidden = sum(1 for r in log if r["status"] == 403)
    assert forbidden == 11 and by_class["2xx"] > 0  # p/1.html and p/10..19.html
    got = monitor.metrics()
    status, snap = get_json(monitor.url + "api/snapshot")
    assert status == 200
    for cls in ("1xx", "2xx", "3xx", "4xx", "5xx"):
        assert got[("scrapy_fleet_responses_total", (("status_class", cls),))] == by_class[cls]
        assert snap["counters"]["responses"][cls] == by_class[cls]
    assert got[("scrapy_fleet_pages_total", ())] == len(log)
    assert got[("scrapy_fleet_bans_total", ())] == forbidden
    items = read_items(tmp_path / f"out-{n}.jsonl" for n in range(2))
    ok_pages = {site.url.rstrip("/") + r["path"] for r in log if r["status"] == 200}
    assert {item["url"] for item in items} <= ok_pages and items
    assert got[("scrapy_fleet_items_total", (("outcome", "scraped"),))] == len(items)
    assert snap["counters"]["items_scraped"] == len(items)
    assert got[("scrapy_fleet_block_ratio", ())] == pytest.approx(forbidden / len(log),
                                                                  abs=1e-6)
    assert got[("scrapy_fleet_frontier_requests", (("state", "due"),))] == 0
    assert got[("scrapy_fleet_requests_total", (("event", "acked"),))] == len(log)
    assert len(got) <= 150


@contextmanager
def chromium_page(tmp_path: Path) -> Iterator[Any]:
    """A page of Debian's chromium (playwright, never ``playwright install``), HOME in
    *tmp_path*; JavaScript errors of the page fail the test."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} not installed (CI is set)")
        pytest.skip(f"{CHROMIUM} not installed")
    home = tmp_path / "browser-home"
    home.mkdir(exist_ok=True)
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(home)  # the playwright driver writes there too
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                        env={**os.environ, "HOME": str(home)})
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                yield page
                assert not errors, errors
            finally:
                browser.close()
    finally:
        if old_home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old_home


def test_dashboard_in_chromium_during_a_crawl(redis_url, site_factory, worker_env, tmp_path,
                                              monitors):
    generate_site(tmp_path / "www", 300, 5)
    site = site_factory(tmp_path / "www", behaviour={
        "delays": [{"prefix": "/site/p/", "seconds": 0.5}],
        "failures": [{"prefix": "/site/p/1", "status": 403}]})
    push(redis_url, worker_env, site.url + "site/")
    monitor = Monitor(redis_url, "docs", worker_env)
    monitors.append(monitor)
    procs, _ = start_fleet(tmp_path, redis_url, worker_env, 2,
                           {"FLEET_IDLE_TIMEOUT": 5, "CONCURRENT_REQUESTS": 2})
    try:
        pids = {p.pid for p in procs}

        def fleet_running() -> bool:
            status, snap = get_json(monitor.url + "api/snapshot")
            alive = [w["id"] for w in snap["workers"] if w["health"] == "alive"]
            return status == 200 and all(any(f":{pid}" in wid for wid in alive)
                                         for pid in pids)

        wait_until(fleet_running, 60, "both workers in the snapshot")
        shot = tmp_path / "dashboard.png"
        with chromium_page(tmp_path) as page:
            page.goto(monitor.url, wait_until="load")
            page.wait_for_function(
                "() => document.querySelectorAll('#workers tbody tr:not(.none)').length >= 2"
                " && +document.getElementById('chart-depth').dataset.points > 0"
                " && +document.getElementById('chart-pages').dataset.points > 0",
                timeout=60_000)
            rows = page.locator("#workers tbody tr:not(.none)").all_inner_texts()
            for pid in pids:
                assert any(f":{pid}" in row and "alive" in row for row in rows), rows
            assert page.locator("#chart-depth path.line").count() >= 1
            assert page.locator("#error").is_hidden()
            assert page.locator("#up").inner_text() == "live"
            before = page.locator("#updated").inner_text()
            page.wait_for_function(  # it refreshes by itself
                f"() => document.getElementById('updated').textContent !== {before!r}",
                timeout=20_000)
            page.screenshot(path=str(shot), full_page=True)
            # a SIGKILLed worker turns dead on the page and in /metrics once its heartbeats
            # are older than FLEET_WORKER_DEAD_AFTER (6 s; + one refresh and one sample)
            victim = procs[0]
            assert victim.poll() is None, "the crawl ended before the kill: make it longer"
            kill_worker(victim)
            page.wait_for_function(
                "pid => [...document.querySelectorAll('#workers tbody tr')].some(tr =>"
                " tr.cells[0].textContent.includes(':' + pid + ':')"
                " && tr.cells[2].textContent === 'dead')", arg=victim.pid, timeout=25_000)
            got = monitor.metrics()
            assert got[("scrapy_fleet_workers", (("health", "dead"),))] == 1
            assert got[("scrapy_fleet_workers", (("health", "alive"),))] == 1
        print(f"dashboard screenshot: {shot}")
        if os.environ.get("FLEET_DOCS_SCREENSHOT"):
            shutil.copy(shot, os.environ["FLEET_DOCS_SCREENSHOT"])
        assert shot.stat().st_size > 10_000
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_keda_example_reads_what_the_monitor_serves(redis_url, worker_env, monitors):
    """docs/keda-scaledobject.yaml names a snapshot field and a metric: both must exist."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "keda-scaledobject.yaml").read_text()
    field = re.search(r'valueLocation: "(\w+)"', text)
    query = re.search(r"query: '(.+)'", text)
    assert field and query
    push(redis_url, worker_env, "http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    monitor = Monitor(redis_url, "docs", worker_env)
    monitors.append(monitor)
    status, snap = get_json(monitor.url + "api/snapshot")
    assert status == 200 and snap[field.group(1)] == 2  # 2 due on a host that may run now
    names = {name for name, _ in monitor.metrics()}
    for metric in re.findall(r"(scrapy_fleet_\w+)", query.group(1)):
        assert metric in names, metric


def test_dashboard_shows_a_banner_while_redis_is_down(redis_server, redis_url, worker_env,
                                                      tmp_path, monitors):
    push(redis_url, worker_env, "http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    monitor = Monitor(redis_url, "docs", worker_env)
    monitors.append(monitor)
    due = '.figure[data-key="due"] .v'
    with chromium_page(tmp_path) as page:
        page.goto(monitor.url, wait_until="load")
        page.wait_for_function("() => document.getElementById('up').textContent === 'live'",
                               timeout=30_000)
        assert page.locator(due).inner_text() == "2"
        redis_server.stop()
        try:
            page.wait_for_function("() => !document.getElementById('error').hidden",
                                   timeout=30_000)
            banner = page.locator("#error").inner_text()
            assert "cannot read Redis" in banner and "showing the last data read" in banner
            assert page.locator("#up").inner_text() == "Redis down"
            assert page.locator(due).inner_text() == "2"  # the last snapshot stays shown
            page.screenshot(path=str(tmp_path / "dashboard-redis-down.png"), full_page=True)
        finally:
            redis_server.restart()
        push(redis_url, worker_env, "http://127.0.0.1:9/c")  # the restarted Redis is empty
        page.wait_for_function("() => document.getElementById('error').hidden",
                               timeout=30_000)
        page.wait_for_function(
            f"() => document.querySelector({due!r}).textContent === '1'", timeout=30_000)
        assert page.locator("#up").inner_text() == "live"


def test_monitor_keeps_the_series_going_while_no_worker_runs(redis_url, worker_env, monitors):
    push(redis_url, worker_env, "http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    monitor = Monitor(redis_url, "docs", worker_env)
    monitors.append(monitor)

    def points() -> list[Any]:
        status, data = get_json(monitor.url + "api/series?name=depth_due&tier=10s")
        assert status == 200 and data["step_s"] == 10
        return [v for _, v in data["series"]["depth_due"] if v is not None]

    # the push took one sample; without a worker only the monitor can take the next ones
    got = wait_until(lambda: len(points()) >= 3 and points(), 45, "3 samples of depth_due")
    assert set(got) == {2.0}


def test_scrapy_fleet_monitor_inside_the_project(redis_url, worker_env):
    push(redis_url, worker_env, "http://127.0.0.1:9/a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy", "fleet", "monitor", "docs", "--port", "0",
         "-s", f"FLEET_REDIS_URL={redis_url}"], cwd=EXAMPLE_PROJECT, env=worker_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"dashboard (http://127\.0\.0\.1:\d+/)", line)
        assert match, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr
                              else "")
        got = samples(get(match.group(1) + "metrics")[1].decode())
        assert got[("scrapy_fleet_up", ())] == 1
        assert got[("scrapy_fleet_frontier_requests", (("state", "due"),))] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            stop_process(proc)


def test_dashboard_pages_per_min_card_and_legend_show_one_figure(redis_url, worker_env,
                                                                tmp_path, monitors):
    # issue 19: the pages/min card (rate over the last minute) and the chart's legend (the
    # last 10 s step's rate) showed 40 and 204.3 at the same moment: one definition now
    import redis

    from scrapy_fleet.keys.crawl import CrawlKeys
    from scrapy_fleet.monitoring import series

    push(redis_url, worker_env, "http://127.0.0.1:9/a")
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "docs")
    sec, usec = client.time()
    now = sec + usec / 1e6
    step, points = series.TIERS["10s"]
    raw = bytearray(series.tier_bytes("10s"))
    # 0 pages until 20 s ago, then 1000 in the last 10 s step: the step's rate is 6000/min,
    # the rate over the crawl's 40 s is 1500/min
    for t, pages in ((now - 40, 0), (now - 30, 0), (now - 20, 0), (now - 10, 1000)):
        slot = int(t * 1000) // (step * 1000)
        series._SLOT.pack_into(raw, (slot % points) * series.SLOT_BYTES, int(t * 1000), 1,
                               0, 0, 0, 0, pages, 0, 0, 0)
    client.set(keys.series("10s"), bytes(raw))
    client.hset(keys.stats, "pages", 1000)
    client.close()
    monitor = Monitor(redis_url, "docs", worker_env)
    monitors.append(monitor)
    with chromium_page(tmp_path) as page:
        page.goto(monitor.url, wait_until="load")
        page.wait_for_function(
            "() => +document.getElementById('chart-pages').dataset.points > 0", timeout=30_000)
        card = page.locator('.figure[data-key="pages/min"]')
        value = card.locator(".v").inner_text()
        label = card.locator(".k").inner_text()
        legend = page.locator('#legend-pages span[data-series="pages_per_min"]').inner_text()
        assert re.fullmatch(r"pages/min \(last \d+ s\)", label), label
        assert legend == f"{label} {value}", (legend, label, value)
        assert float(value.replace("k", "e3")) < 3000  # the crawl's rate, not the last step's
