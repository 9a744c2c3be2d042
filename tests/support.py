"""Helpers shared by the tests: real processes (redis-server, the test site, Scrapy workers).

Nothing here fakes a service: Redis is a real ``redis-server``, the site is served over TCP by
``python -m testsite serve`` in a subprocess (the Twisted reactor of the test
process stays untouched), and workers are real ``scrapy crawl`` processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# one launcher for the tests, the benchmarks and the demo (re-exported for the tests)
from testsite.processes import RedisServer as RedisServer
from testsite.processes import free_port as free_port
from testsite.processes import stop_process as stop_process

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PROJECT = REPO_ROOT / "example_project"
#: the Scrapy project of the tests (tests/project: spiders codec_trouble, ack_probe, ...)
TEST_PROJECT = REPO_ROOT / "tests" / "project"
PYDOCS_DIR = Path(os.environ.get("FLEET_PYDOCS_DIR")
                  or REPO_ROOT.parent / "shared" / "sites" / "docs.python.org")
PYDOCS_PAGES = 516
"""URLs answering 200 that a crawl of the mirror from /3/ must yield (shared/sites/SOURCES.md):
its 515 HTML files, ``3/index.html`` both as /3/ and as /3/index.html."""

STARTUP_TIMEOUT = 20.0
"""Seconds to wait for a helper process (redis-server, site server) to become ready."""


# -- Test site -----------------------------------------------------------------------------------


@dataclass
class SiteProcess:
    """``python -m testsite serve`` running in a subprocess."""

    root: Path
    proc: subprocess.Popen[str]
    urls: list[str]  # base URLs, one per bound address: "http://127.0.0.1:PORT/"
    log_path: Path
    expected_paths: list[str] = field(default_factory=list)  # set by generated-site fixtures
    start_path: str = "/"

    @property
    def url(self) -> str:
        """Base URL of the first address, ending with "/"."""
        return self.urls[0]

    @property
    def start_url(self) -> str:
        """Where a crawl starts: ``url`` + ``start_path`` (e.g. http://127.0.0.1:P/site/)."""
        return self.url.rstrip("/") + self.start_path

    @property
    def expected_urls(self) -> set[str]:
        """Absolute URLs of ``expected_paths`` on the first address."""
        return {self.url.rstrip("/") + path for path in self.expected_paths}

    def requests(self) -> list[dict[str, Any]]:
        """Every request logged so far (one dict per line of the log)."""
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def stats(self) -> dict[str, Any]:
        """``GET /_testsite/stats``: {"requests": N, "max_concurrent": {host: n}}."""
        with urllib.request.urlopen(self.url + "_testsite/stats", timeout=10) as resp:
            return dict(json.load(resp))

    def configure(self, behaviour: Mapping[str, Any]) -> None:
        """Replace the server's behaviour (delays, failures, robots; see testsite.server)."""
        req = urllib.request.Request(
            self.url + "_testsite/config", data=json.dumps(behaviour).encode(), method="PUT"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def stop(self) -> None:
        stop_process(self.proc)


def start_site(
    root: Path,
    log_path: Path,
    binds: Iterable[str] = ("127.0.0.1",),
    port: int = 0,
    behaviour: Mapping[str, Any] | None = None,
) -> SiteProcess:
    """Serve ``root`` in a subprocess; returns once it prints its base URLs."""
    binds = list(binds)
    args = [sys.executable, "-m", "testsite", "serve", str(root), "--port", str(port)]
    args += ["--log", str(log_path)]
    for addr in binds:
        args += ["--bind", addr]
    if behaviour is not None:
        config = Path(tempfile.mkstemp(prefix="testsite-", suffix=".json", dir=log_path.parent)[1])
        config.write_text(json.dumps(behaviour), encoding="utf-8")
        args += ["--config", str(config)]
    # cwd: `testsite` is a folder of the checkout, not an installed package
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT)
    urls = []
    assert proc.stdout is not None
    for _ in binds:
        line = proc.stdout.readline().strip()  # the server prints one URL per address, at once
        if not line.startswith("http://"):
            stop_process(proc)
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"test site server did not start: {line!r}\n{err}")
        urls.append(line)
    return SiteProcess(root=Path(root), proc=proc, urls=urls, log_path=log_path)


# -- Scrapy workers ------------------------------------------------------------------------------


def isolated_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a worker whose home and XDG dirs live in ``tmp_path``.

    Scrapy's RemoteControl extension writes a token file under ~/.local/state/scrapy and a
    killed worker leaves it behind; this keeps such files out of the real home.
    """
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env.pop("SCRAPY_PROJECT", None)
    home = Path(tmp_path) / "home"
    dirs = {
        "HOME": home,
        "XDG_STATE_HOME": home / ".local" / "state",
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_DATA_HOME": home / ".local" / "share",
    }
    for name, path in dirs.items():
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def scrapy_command(*args: str) -> list[str]:
    """``python -m scrapy ARGS`` with the interpreter running the tests (the venv's)."""
    return [sys.executable, "-m", "scrapy", *args]


def setting_args(settings: Mapping[str, Any]) -> list[str]:
    """``{"K": V}`` -> ``["-s", "K=V"]``; None -> "None", other values str()."""
    args: list[str] = []
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    return args


def start_worker(
    project_dir: Path,
    spider: str,
    settings: Mapping[str, Any],
    env: Mapping[str, str],
    log_path: Path,
    spider_args: Mapping[str, Any] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``scrapy crawl SPIDER -a K=V ... -s K=V ...`` in ``project_dir``; output goes to
    ``log_path``."""
    args = [arg for k, v in (spider_args or {}).items() for arg in ("-a", f"{k}={v}")]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            scrapy_command("crawl", spider, *args, *setting_args(settings)),
            cwd=project_dir,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a SIGINT to the test run does not reach the workers
        )


def run_scrapy(
    project_dir: Path, args: Iterable[str], env: Mapping[str, str], timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run a short ``scrapy`` command (``fleet push``, ``fleet status``...) to completion."""
    return subprocess.run(
        scrapy_command(*args),
        cwd=project_dir,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(check: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.2, explain: Callable[[], str] | None = None) -> Any:
    """Call *check* every *interval* seconds until it returns something true, and return
    that; raise ``AssertionError`` naming *what* (and the last value, and what *explain*
    returns then: a worker's log tail, say) after *timeout* s.  An ``AssertionError`` of
    *check* (a worker that exited meanwhile) is raised at once."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    more = f":\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out waiting for {what} (last: {last!r}){more}")


def running(*procs: subprocess.Popen[Any], log: Path) -> bool:
    """True while every one of *procs* runs; else ``AssertionError`` with *log*'s tail (a
    :func:`wait_until` check that must stop when a worker exited)."""
    assert all(p.poll() is None for p in procs), tail(log)
    return True


def wait_all(procs: Iterable[subprocess.Popen[Any]], timeout: float) -> list[int]:
    """Wait until every process has exited; return their exit codes in order.

    If they are not all done within ``timeout`` seconds, kill the rest and raise
    ``TimeoutError`` (a fleet that does not close by itself is a failure).
    """
    procs = list(procs)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            alive = [p.pid for p in procs if p.poll() is None]
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            raise TimeoutError(f"processes {alive} still running after {timeout} s") from None
    return [int(p.returncode) for p in procs]


def kill_worker(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL (no cleanup at all, like a machine dying) and reap."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def read_items(paths: Iterable[Path], growing: bool = False) -> list[dict[str, Any]]:
    """All items of JSON-lines files (missing files count as empty).

    *growing*: workers may still be appending to the files (a read while they crawl).  Each
    item is one ``write(2)`` ending in a newline (JsonLinesPipeline), yet a reader can see a
    write half done: Linux copies a write into the page cache a page at a time and extends
    the file after each page, so a line straddling a 4 KiB boundary is readable up to the
    boundary first (in /tmp on this machine: 145 of 36995 reads of a file under a constant
    stream of 170-byte appends ended at a page boundary, inside a line).  That unfinished
    last line is left for a later read; without *growing* (every writer has exited) it is a
    torn write, and fails to parse (ValueError).
    """
    items: list[dict[str, Any]] = []
    for path in paths:
        if Path(path).exists():
            lines = Path(path).read_bytes().split(b"\n")
            if growing:
                lines.pop()  # b"" after the last newline, or the line still being written
            items.extend(json.loads(line) for line in lines if line.strip())
    return items


def tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file, for assertion messages."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")[-chars:]
    except FileNotFoundError:
        return f"<no file {path}>"


def worker_stats(log_path: Path) -> dict[str, float]:
    """The numeric stats a worker dumped at its end ("Dumping Scrapy stats"), from its log."""
    text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    start = text.rfind("Dumping Scrapy stats")
    if start < 0:
        return {}
    block = text[start:text.find("}", start) + 1]
    return {key: float(value) for key, value in
            re.findall(r"'([^']+)': (-?\d+(?:\.\d+)?)[,}]", block)}


def queued(client: Any, keys: Any) -> int:
    """Entries queued in a crawl (``keys``: a CrawlKeys): the queue buckets' count."""
    return int(client.get(keys.queue_count) or 0)


def queue_entries(client: Any, keys: Any) -> list[tuple[str, int, str]]:
    """(host, Request.priority, entry id) of every entry in the queue buckets, bucket by bucket
    in the index's order (a host's best priority first), each bucket head first."""
    out = []
    for name in bucket_names(client, keys):
        host, key = name.split("\t")
        for entry in client.lrange(keys.bucket_prefix + name, 0, -1):
            out.append((host, 10**15 - int(key), entry.split(b"\t", 1)[0].decode()))
    return out


def bucket_names(client: Any, keys: Any) -> list[str]:
    """Names "<host>\t<priority key>" of the queue buckets in the index, by host, then best
    priority first (the index: host -> its buckets' priority keys, ascending)."""
    index = client.hgetall(keys.queue_index)
    return [f"{h.decode()}\t{key}" for h in sorted(index) for key in index[h].decode().split()]


def frontier_payloads(client: Any, keys: Any) -> list[bytes]:
    """Encoded requests of every entry in a crawl's frontier: leased and deferred ones (in
    `data`) and queued ones (in their bucket entries)."""
    out = list(client.hvals(keys.data))
    for name in bucket_names(client, keys):
        for entry in client.lrange(keys.bucket_prefix + name, 0, -1):
            out.append(entry.split(b"\t", 1)[1])
    return out


# -- Redis state ---------------------------------------------------------------------------------


def keyspace(client: Any) -> dict[bytes, tuple[bytes, Any]]:
    """Every key of the client's database with its type and whole value (strings as bytes,
    hashes as dicts, lists as lists, sets as sorted lists, sorted sets as (member, score)
    lists): what a contract test compares before and after one script call."""
    state: dict[bytes, tuple[bytes, Any]] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            value: Any = client.get(key)
        elif kind == b"hash":
            value = client.hgetall(key)
        elif kind == b"list":
            value = client.lrange(key, 0, -1)
        elif kind == b"set":
            value = sorted(client.smembers(key))
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        else:
            value = kind
        state[key] = (kind, value)
    return state


def changed_keys(before: Mapping[bytes, Any], after: Mapping[bytes, Any]) -> set[str]:
    """Names of the keys written between two :func:`keyspace` reads: created, deleted, or
    holding another value."""
    return {key.decode() for key in set(before) | set(after)
            if before.get(key) != after.get(key)}


def server_ms(client: Any) -> int:
    """The Redis server's clock (TIME) in ms: the only clock of the scripts."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_server_past(client: Any, ms: float, timeout: float = 30.0) -> None:
    """Until the Redis server's clock is past *ms* (a lease expiry, a deferred entry's due
    time...): a test that waits for a script's time window waits for that clock, not for a
    fixed sleep of its own."""
    deadline = time.monotonic() + timeout
    while server_ms(client) <= ms:
        if time.monotonic() > deadline:
            raise AssertionError(f"the Redis server's clock did not pass {ms} in {timeout} s")
        time.sleep(0.005)


# -- Frontier calls and monitoring (the Lua and worker tiers) -------------------------------------


def link_entry(url: str, group: int = 0, host: str = "h.test") -> tuple[bytes, int, bytes, int,
                                                                        str]:
    """A push of a frontier call (CallBatch.pushes) for *url*: its Bloom key, priority 0, the
    encoded Request, *group* (0: no parent; k: a link of the k-th acknowledgement), *host*."""
    from scrapy import Request

    from scrapy_fleet import codec
    from scrapy_fleet.frontier.bloom import bloom_key

    return bloom_key(url.encode()), 0, codec.encode(Request(url)), group, host


def idle_scheduler(redis_url: str, spider: Any, urls: list[str],
                   settings: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """A FleetScheduler of crawl ``spider.name`` built outside a crawl (no engine running:
    nothing to wake), its book bound to a *spider* instance, and a FrontierAdmin that pushed
    *urls* (one per host, priority 0): ``(scheduler, admin)``.  *settings* go over the
    defaults (2 requests, prefetch 2, the Bloom dupefilter)."""
    from types import SimpleNamespace

    from scrapy import Request
    from scrapy.utils.test import get_crawler

    from scrapy_fleet import codec
    from scrapy_fleet.frontier.admin import FrontierAdmin
    from scrapy_fleet.frontier.scheduler import FleetScheduler

    crawler = get_crawler(type(spider), settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": spider.name,
        "CONCURRENT_REQUESTS": 2, "FLEET_PREFETCH": 2,
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter",
        **(settings or {})})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    crawler.engine = SimpleNamespace(_slot=None)
    sched.book.spider = spider
    admin = FrontierAdmin(redis_url, spider.name, params=sched.config.frontier_params())
    admin.push([(b"", 0, codec.encode(Request(u)), 0, u.split("/")[2]) for u in urls])
    return sched, admin


def host_entry(url: str) -> tuple[bytes, int, bytes, int, str]:
    """:func:`link_entry` without a parent, counted for its URL's host."""
    return link_entry(url, 0, url.split("/")[2])


def monitor_payload(cs: int | None = None, counters: dict[str, int] | None = None,
                    hosts: list[list[object]] | None = None, forget_ms: int = 120_000,
                    leases: int = 0, state: str = "idle") -> bytes:
    """ARGV[2] of a frontier call, as WorkerMonitor.payload builds it (lua/monitoring.lua's
    header): a heartbeat, and with *cs* a batch of counter and per-host deltas."""
    import msgpack

    arg: dict[str, object] = {"hb": {"st": state, "l": leases, "h": "testhost", "pid": 1,
                                     "sa": 1.0},
                              "fa": forget_ms, "da": 15_000}
    if cs is not None:
        arg.update(cs=cs, c=counters or {}, hp=hosts or [])
    return msgpack.packb(arg, use_bin_type=False)


def crawl_snapshot(redis_url: str, crawl: str, **kwargs: Any) -> dict[str, Any]:
    """The monitoring snapshot of *crawl* (monitoring/snapshot.py read_snapshot)."""
    import redis

    from scrapy_fleet.keys.crawl import CrawlKeys
    from scrapy_fleet.monitoring.snapshot import read_snapshot

    client = redis.Redis.from_url(redis_url)
    try:
        return read_snapshot(client, CrawlKeys("fleet", crawl), **kwargs)
    finally:
        client.close()


def hosts_in_partition(p: int, parts: int, n: int = 1) -> list[str]:
    """The first *n* host names ``h<i>.test`` that :func:`scrapy_fleet.keys.partition_of`
    puts in partition *p* of *parts*."""
    from scrapy_fleet.keys.partition import partition_of

    return [h for h in (f"h{i}.test" for i in range(1000)) if partition_of(h, parts) == p][:n]


def push_row(host: str, tag: bytes = b"", group: int = 0) -> tuple[bytes, int, bytes, int, str]:
    """A push of the pump's format for *host*: a random Bloom key, priority 0, payload *tag*
    (default: the host's name), acknowledgement group *group*."""
    return (os.urandom(12), 0, tag or host.encode(), group, host)


class ReplyEater:
    """A TCP proxy to Redis at *port*.  ``mode``: "pass" forwards both ways; "eat" forwards
    what the client sends and drops Redis's next reply with the connection (``eaten`` counts
    them), then turns "down"; "down" closes every connection at once, forwarding nothing.
    With *only* (bytes, say a partition's hash tag) "eat" and "down" apply to the requests
    that contain it alone: the connection is closed when one comes (forwarded first in
    "eat"), the others pass; in "eat", the first *skip* of them pass too."""

    def __init__(self, port: int, only: bytes | None = None) -> None:
        self.port = port
        self.only = only
        self.mode = "pass"
        self.eaten = 0
        self.skip = 0
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def _down(self) -> bool:
        return self.mode == "down" and self.only is None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._down():
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        eat_next = asyncio.Event()  # (*only*: the reply to the request forwarded last)

        async def to_redis() -> None:
            while (data := await reader.read(65536)) and not self._down():
                if self.only is not None and self.only in data and self.mode != "pass":
                    if self.mode == "down":
                        return
                    if self.skip:
                        self.skip -= 1
                    else:
                        eat_next.set()
                up_writer.write(data)
                await up_writer.drain()

        async def to_client() -> None:
            while (data := await up_reader.read(65536)) and not self._down():
                if eat_next.is_set() if self.only is not None else self.mode == "eat":
                    self.mode = "down"
                    self.eaten += 1
                    return
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.ensure_future(to_redis()), asyncio.ensure_future(to_client())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
        up_writer.close()
@contextlib.contextmanager
def partition_user(redis_server: Any, crawl_id: str,
                   base: str) -> Iterator[tuple[str, Callable[[str], None]]]:
    """An ACL user ``half`` with a worker's commands on the keys under *base* only (a
    partition's ``CrawlKeys.base``): a client of its URL stands for a worker that cannot reach
    the other partitions (their master being failed over).  Yields its URL and ``reach(b)``,
    which lets it reach the keys under *b* too; the user is deleted after."""
    from scrapy_fleet import acl

    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "half", "reset", "on", ">pw",
                          *acl.acl_rule("worker", crawl_id=crawl_id).split(), f"~{base}:*")
    try:
        yield (f"redis://half:pw@127.0.0.1:{redis_server.port}/0",
               lambda b: admin.execute_command("ACL", "SETUSER", "half", f"~{b}:*"))
    finally:
        admin.execute_command("ACL", "DELUSER", "half")
