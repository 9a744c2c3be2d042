"""The main job, end to end: a real multi-worker fleet crawl of a local static site.

    .venv/bin/python example_project/run_demo.py                      # generated 200-page site
    .venv/bin/python example_project/run_demo.py --site ../shared/sites/docs.python.org --start /3/

Steps: start a private redis-server on a free port (data under ./.demo/, no persistence);
serve the site on 127.0.0.1 (by default a site generated into .demo/site); push the start URL
with ``scrapy fleet push docs URL``; start N workers ``scrapy crawl docs`` with
``FLEET_IDLE_TIMEOUT=5`` and one JSON-lines output each (.demo/out-N.jsonl, logs in
.demo/worker-N.log); print progress once a second; wait for the workers to close by
themselves; print a summary with the site's responses by status (and each path that answered
404) and one final verdict line, ``OK: N pages, each once`` or ``FAILED: ...``.  What the site
should yield is found by walking the served folder with the demo's spider, without a
crawler (:func:`site_should_yield`); exit status 1 if a worker failed, nothing was crawled,
a page is missing or twice, or the 404s differ.  Redis and the site server are stopped at
the end, also on Ctrl-C.

With ``--mongo-uri URI`` (default: the environment variable ``MONGO_URI``; ``make demo
MONGO_URI=mongodb://...``) each worker also gets ``-s FLEET_MONGO_URI=URI``: items are upserted
into MongoDB (database ``scrapy``, collection ``docs``, the pipeline's defaults) and still
written to the JSON-lines files, which the progress line and the duplicate count read. The
summary then adds the documents in the collection (``count_documents`` via pymongo), and on
the generated site checks that this run left exactly one document per page.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

PROJECT_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROJECT_DIR.parent
if str(REPO_ROOT) not in sys.path:  # testsite/ is a folder of the checkout, not installed
    sys.path.insert(0, str(REPO_ROOT))

from testsite.generate import positive_int  # noqa: E402 - after the path set-up above
from testsite.processes import RedisServer, stop_process  # noqa: E402

DEMO_DIR = REPO_ROOT / ".demo"
SPIDER = "docs"
# Where MongoPipeline writes with its defaults (FLEET_MONGO_DATABASE, collection = spider name).
MONGO_DATABASE = "scrapy"
MONGO_COLLECTION = SPIDER


def log(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def stop(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, SIGKILL after ``timeout`` seconds."""
    stop_process(proc, timeout)


def stop_all(procs: list[subprocess.Popen[Any]]) -> None:
    for proc in procs:
        stop(proc)


def start_redis(stack: ExitStack) -> str:
    try:
        server = RedisServer(DEMO_DIR / "redis", new_session=True).start()
    except RuntimeError as exc:
        sys.exit(str(exc))
    stack.callback(server.stop)
    assert server.proc is not None
    log(f"redis-server {server.url} (pid {server.proc.pid})")
    return server.url


def serve_site(stack: ExitStack, root: Path) -> str:
    args = [
        sys.executable,
        "-m",
        "testsite",
        "serve",
        str(root),
        "--bind",
        "127.0.0.1",
        "--port",
        "0",
        "--log",
        str(DEMO_DIR / "site-requests.jsonl"),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=REPO_ROOT)  # testsite/ is a folder of the checkout
    stack.callback(stop, proc)
    assert proc.stdout is not None
    base = proc.stdout.readline().strip()
    if not base.startswith("http://"):
        sys.exit(f"the site server did not start (exit {proc.poll()})")
    log(f"serving {root} at {base} (pid {proc.pid})")
    return base


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    # Scrapy's RemoteControl extension keeps a token file under $XDG_STATE_HOME/scrapy.
    env["XDG_STATE_HOME"] = str(DEMO_DIR / "state")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Progress:
    """Counts items in the workers' outputs (incrementally) and reads the frontier status."""

    def __init__(self, outputs: list[Path], redis_url: str) -> None:
        self.outputs = outputs
        self.offsets = dict.fromkeys(outputs, 0)
        self.lines = dict.fromkeys(outputs, 0)
        self.admin: Any = None
        try:
            from scrapy_fleet.frontier.admin import FrontierAdmin

            self.admin = FrontierAdmin(redis_url, SPIDER)
        except Exception as exc:  # the status is a nicety; line counts always work
            log(f"frontier status unavailable ({exc}); showing item counts only")

    def items(self) -> int:
        for path in self.outputs:
            if path.exists():
                with open(path, "rb") as fh:
                    fh.seek(self.offsets[path])
                    chunk = fh.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]
                self.offsets[path] += len(complete)
                self.lines[path] += complete.count(b"\n")
        return sum(self.lines.values())

    def workers_seen(self) -> int | None:
        """Workers that have sent a heartbeat (their engine runs), or None if unknown."""
        if self.admin is None:
            return None
        try:
            return int(self.admin.client.zcard(self.admin.keys.workers))
        except Exception:
            return None

    def status(self) -> dict[str, Any] | None:
        if self.admin is None:
            return None
        try:
            return dict(self.admin.status())
        except Exception:
            return None


@dataclass
class SiteYield:
    """What a crawl of a served folder from one start URL must give, found without a crawler:
    the demo's spider (example_project/spiders) run on every page read from disk, with the
    site server's rules (``/x/`` is ``x/index.html``, ``/x`` of a directory redirects to
    ``/x/``, the query is ignored, anything else is 404)."""

    pages: set[str] = field(default_factory=set)  #: URLs that must give one item each
    statuses: Counter[int] = field(default_factory=Counter)  #: URLs requested, by status
    not_found: list[str] = field(default_factory=list)  #: URLs that must answer 404


def _serve(root: Path, path: str) -> tuple[int, Path | None]:
    """The site server's answer to *path*: (status, file) (testsite/server.py)."""
    target = (root / unquote(path).lstrip("/")).resolve()
    if not target.is_relative_to(root):
        return 404, None
    if target.is_dir():
        if not path.endswith("/"):
            return 301, None
        target = target / "index.html"
    return (200, target) if target.is_file() else (404, None)


def site_should_yield(root: Path, start_url: str) -> SiteYield:
    """Walk the site from *start_url* as the fleet would, one request per canonical URL."""
    from scrapy import Request
    from scrapy.http import HtmlResponse, Response
    from w3lib.url import canonicalize_url

    sys.path.insert(0, str(PROJECT_DIR))
    from example_project.spiders.docs import DocsSpider

    spider = DocsSpider()
    root = root.resolve()
    result = SiteYield()
    seen = {canonicalize_url(start_url)}
    todo = deque([Request(start_url)])
    while todo:
        request = todo.popleft()
        parts = urlsplit(request.url)
        status, target = _serve(root, parts.path or "/")
        result.statuses[status] += 1
        follow: list[Request] = []
        if status == 301:
            follow.append(request.replace(url=urlunsplit(parts._replace(path=parts.path + "/"))))
        elif status == 404:
            result.not_found.append(request.url)
        elif target is not None:
            ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
            if ctype.startswith("text/"):
                ctype += "; charset=utf-8"
            cls = HtmlResponse if ctype.startswith("text/html") else Response
            response = cls(request.url, body=target.read_bytes(), request=request,
                           headers={"Content-Type": ctype})
            for out in spider.parse(response) or ():
                if isinstance(out, Request):
                    follow.append(out)
                else:
                    result.pages.add(out["url"])
        for new in follow:
            key = canonicalize_url(new.url)
            if key not in seen:
                seen.add(key)
                todo.append(new)
    return result


def site_statuses(log_path: Path) -> tuple[Counter[int], list[str], int]:
    """From the site server's request log: requests by status, the paths that answered 404,
    and how many paths were requested more than once."""
    statuses: Counter[int] = Counter()
    per_path: Counter[str] = Counter()
    not_found: list[str] = []
    if log_path.exists():
        with open(log_path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                record = json.loads(line)
                statuses[record["status"]] += 1
                per_path[record["path"]] += 1
                if record["status"] == 404 and per_path[record["path"]] == 1:
                    not_found.append(record["path"])
    return statuses, not_found, sum(1 for n in per_path.values() if n > 1)


def by_status(counts: Counter[int]) -> str:
    return ", ".join(f"{status}: {n}" for status, n in sorted(counts.items())) or "none"


def read_items(paths: list[Path]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            with open(path, encoding="utf-8") as fh:
                items.extend(json.loads(line) for line in fh if line.strip())
    return items


def count_mongo_documents(uri: str, since: datetime) -> tuple[int, int] | None:
    """(documents in the demo's collection, documents written since *since*), or None."""
    try:
        from pymongo import MongoClient
        from pymongo.errors import PyMongoError
    except ImportError as exc:
        log(f"cannot count MongoDB documents: {exc}")
        return None
    client: Any = MongoClient(uri, serverSelectionTimeoutMS=10000, appname="scrapy-fleet-demo")
    try:
        coll = client[MONGO_DATABASE][MONGO_COLLECTION]
        total = coll.count_documents({})
        this_run = coll.count_documents({"updated_at": {"$gte": since}})
        return int(total), int(this_run)
    except PyMongoError as exc:
        log(f"cannot count MongoDB documents: {type(exc).__name__}: {exc}")
        return None
    finally:
        client.close()


def main() -> int:
    global DEMO_DIR
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="static folder to serve (default: generate one)")
    parser.add_argument("--start", help="start path or URL (default /site/, or / with --site)")
    parser.add_argument("--workers", type=positive_int, default=3)
    parser.add_argument("--pages", type=positive_int, default=200,
                        help="size of the generated site")
    parser.add_argument("--links", type=positive_int, default=8, help="links per generated page")
    parser.add_argument("--idle-timeout", type=float, default=5, help="FLEET_IDLE_TIMEOUT (s)")
    parser.add_argument("--host-delay", type=float, default=0,
                        help="FLEET_HOST_DELAY (s): fleet-wide seconds between two requests "
                             "to the site (default: the project's)")
    parser.add_argument("--timeout", type=float, default=1800, help="give up after (s)")
    parser.add_argument(
        "--mongo-uri",
        default=os.environ.get("MONGO_URI") or None,
        help="also write items to MongoDB with FLEET_MONGO_URI (default: $MONGO_URI)",
    )
    parser.add_argument("--dir", type=Path, default=DEMO_DIR,
                        help="working folder: Redis data, site, outputs, logs (default .demo)")
    args = parser.parse_args()

    DEMO_DIR = args.dir.resolve()
    DEMO_DIR.mkdir(exist_ok=True)
    for old in [*DEMO_DIR.glob("out-*.jsonl"), *DEMO_DIR.glob("worker-*.log")]:
        old.unlink()
    (DEMO_DIR / "site-requests.jsonl").unlink(missing_ok=True)

    expected: set[str] | None = None
    if args.site is None:
        from testsite import generate_site

        site_dir = DEMO_DIR / "site"
        shutil.rmtree(site_dir, ignore_errors=True)
        paths = generate_site(site_dir, args.pages, args.links)
        log(f"generated a {args.pages}-page site in {site_dir}")
        start = args.start or "/site/"
    else:
        site_dir = args.site.resolve()
        if not site_dir.is_dir():
            sys.exit(f"--site: not a directory: {args.site}")
        start = args.start or "/"

    workers: list[subprocess.Popen[bytes]] = []
    with ExitStack() as stack:
        redis_url = start_redis(stack)
        base = serve_site(stack, site_dir)
        stack.callback(stop_all, workers)  # LIFO: workers stop before the site and redis
        start_url = start if "://" in start else base.rstrip("/") + "/" + start.lstrip("/")
        if args.site is None:
            expected = {base.rstrip("/") + p for p in paths}
        env = worker_env()
        push = subprocess.run(
            [
                sys.executable,
                "-m",
                "scrapy",
                "fleet",
                "push",
                SPIDER,
                start_url,
                "-s",
                f"FLEET_REDIS_URL={redis_url}",
            ],
            cwd=PROJECT_DIR,
            env=env,
            capture_output=True,
            text=True,
        )
        if push.returncode != 0:
            print(push.stdout + push.stderr, file=sys.stderr)
            log(f"`scrapy fleet push` failed (exit {push.returncode})")
            return 1
        log(f"pushed {start_url}: {push.stdout.strip() or push.stderr.strip()[-200:]}")

        outputs = [DEMO_DIR / f"out-{n}.jsonl" for n in range(1, args.workers + 1)]
        mongo_args = ["-s", f"FLEET_MONGO_URI={args.mongo_uri}"] if args.mongo_uri else []
        if args.mongo_uri:
            where = re.sub(r"//[^@/]*@", "//***@", args.mongo_uri)  # no password in the log
            log(f"items also go to MongoDB {where}, {MONGO_DATABASE}.{MONGO_COLLECTION}")
        # BSON datetimes have millisecond precision: documents this run writes have
        # updated_at >= run_start.
        now = datetime.now(timezone.utc)
        run_start = now.replace(microsecond=now.microsecond // 1000 * 1000)
        started = time.monotonic()
        for n, out in enumerate(outputs, 1):
            with open(DEMO_DIR / f"worker-{n}.log", "wb") as wlog:
                cmd = [
                    sys.executable,
                    "-m",
                    "scrapy",
                    "crawl",
                    SPIDER,
                    "-s",
                    f"FLEET_REDIS_URL={redis_url}",
                    "-s",
                    f"FLEET_IDLE_TIMEOUT={args.idle_timeout:g}",
                    "-s",
                    f"FLEET_JSONL_PATH={out}",
                    *(["-s", f"FLEET_HOST_DELAY={args.host_delay:g}"] if args.host_delay else []),
                    *mongo_args,
                ]
                workers.append(
                    subprocess.Popen(
                        cmd,
                        cwd=PROJECT_DIR,
                        env=env,
                        stdout=wlog,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        log(f"started {args.workers} workers (logs: .demo/worker-N.log); waiting for them to close")

        progress = Progress(outputs, redis_url)
        tty = sys.stdout.isatty()
        while any(w.poll() is None for w in workers):
            elapsed = time.monotonic() - started
            if elapsed > args.timeout:
                # a SIGTERM that reaches a worker before its engine runs is lost (Scrapy
                # stops a crawl that has not begun, which then begins): stop running ones
                seen = progress.workers_seen()
                if seen is not None and seen < len(workers) and elapsed < args.timeout + 60:
                    time.sleep(0.1)
                    continue
                log(f"timeout after {args.timeout:g} s: stopping the workers")
                break
            running = sum(w.poll() is None for w in workers)
            line = f"{elapsed:6.1f}s  items {progress.items():6d}"
            st = progress.status()
            if st is not None:
                line += (
                    f"  queued {st['queued']:6d}  leased {st['leased']:4d}"
                    f"  dead {st['dead']:3d}  seen {st['seen']:6d}"
                )
            line += f"  workers {running}/{len(workers)}"
            print(("\r" if tty else "") + line, end="" if tty else "\n", flush=True)
            time.sleep(1)
        if tty:
            print()
        seconds = time.monotonic() - started
        for w in workers:
            stop(w)
        codes = [w.returncode for w in workers]
        final = progress.status()

    items = read_items(outputs)
    per_url = Counter(item["url"] for item in items)
    duplicates = sum(c - 1 for c in per_url.values())
    stamps = sorted(datetime.fromisoformat(i["fetched_at"]) for i in items if i.get("fetched_at"))
    crawl_span = (stamps[-1] - stamps[0]).total_seconds() if stamps else 0.0
    dead = final["dead"] if final else "?"
    statuses, not_found, refetched = site_statuses(DEMO_DIR / "site-requests.jsonl")
    should = site_should_yield(site_dir, start_url)
    print()
    print("== summary ==")
    print(f"start URL        {start_url}")
    print(f"workers          {len(workers)}, exit codes {codes}")
    print(f"items per worker {[progress.lines[o] for o in outputs]}")
    print(f"pages            {len(per_url)} unique URLs "
          f"(the site should yield {len(should.pages)})")
    print(f"items            {len(items)}")
    print(f"duplicates       {duplicates}")
    print(f"dead letters     {dead}")
    print(f"responses        {by_status(statuses)} (the site should answer "
          f"{by_status(should.statuses)})")
    for path in not_found:
        print(f"  404            {path}")
    print(f"fetched again    {refetched} paths (a lease expired, or a worker was killed)")
    print(
        f"seconds          {seconds:.1f} until every worker closed "
        f"(first to last item: {crawl_span:.1f}, idle timeout {args.idle_timeout:g})"
    )
    print("outputs          " + " ".join(os.path.relpath(o) for o in outputs))
    mongo: tuple[int, int] | None = None
    if args.mongo_uri:
        mongo = count_mongo_documents(args.mongo_uri, run_start)
        if mongo is None:
            print(f"mongo documents  ? (could not count {MONGO_DATABASE}.{MONGO_COLLECTION})")
        else:
            print(
                f"mongo documents  {mongo[1]} written by this run, "
                f"{mongo[0]} in {MONGO_DATABASE}.{MONGO_COLLECTION}"
            )
    if expected is not None and expected != should.pages:  # the walk and the generator agree
        log(f"note: the generated site lists {len(expected)} pages, the walk found "
            f"{len(should.pages)}")
        should.pages = expected

    problems = []
    if any(code != 0 for code in codes):
        problems.append("a worker exited with an error (see .demo/worker-N.log)")
    if not items:
        problems.append("nothing was crawled")
    missing = should.pages - set(per_url)
    unexpected = set(per_url) - should.pages
    if missing:
        problems.append(f"{len(missing)} of {len(should.pages)} pages missing")
    if duplicates:
        problems.append(f"{duplicates} duplicate items")
    if unexpected:
        problems.append(f"{len(unexpected)} pages the site should not yield")
    base = start_url[: start_url.index("/", start_url.index("//") + 2)]
    expected_404 = {urlsplit(u).path for u in should.not_found}
    if set(not_found) != expected_404:
        problems.append(f"{len(not_found)} paths answered 404, the site has {len(expected_404)} "
                        f"such links under {base}")
    if args.mongo_uri and (mongo is None or (items and mongo[1] != len(per_url))):
        got = "?" if mongo is None else mongo[1]
        problems.append(f"{got} MongoDB documents written by this run for {len(per_url)} pages")
    if problems:
        print(f"FAILED: {'; '.join(problems)}")
        return 1
    broken = f"{len(not_found)} link{'s' if len(not_found) != 1 else ''}"
    print(f"OK: {len(per_url)} pages, each once"
          + (f" ({broken} answered 404, as the site has them)" if not_found else ""))
    return 0


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Ctrl-C and SIGTERM both unwind main(), whose ExitStack stops workers, site and redis.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; workers, site server and redis were stopped")
        sys.exit(130)
