"""The catalog of every ``FLEET_*`` setting: name, default, type, one line of meaning, and the
page documenting it.  One source for the defaults (:data:`DEFAULTS`, read by config.py),
``scrapy fleet settings`` (:func:`settings_listing`), the unknown-setting warning
(:func:`unknown_settings`) and the docs check (tests/unit/test_config.py).  Validation of the values
is config.py's, and each feature's own (proxies/settings.py, stages/settings.py,
browser/settings.py, politeness/settings.py, jsonl_settings.py,
pipelines/mongo_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Import paths of the Request classes that may be rebuilt from the frontier (see codec).
DEFAULT_REQUEST_CLASSES = (
    "scrapy.http.request.Request",
    "scrapy.http.request.form.FormRequest",
    "scrapy.http.request.json_request.JsonRequest",
    "scrapy.http.request.rpc.XmlRpcRequest",
)

#: What error messages point at for the valid values: a listing every installation has
#: (docs/settings.md is only in the source tree).
SETTINGS_HELP = "`scrapy fleet settings` or `scrapy-fleet settings`"

#: Setting sections, in the order ``scrapy fleet settings`` lists them.
SECTIONS = ("connection", "identity", "frontier", "dupefilter", "bounds", "politeness",
            "sinks", "mongo", "failures", "monitoring", "proxies", "stages", "browser",
            "recrawl", "sessions", "budgets")


@dataclass(frozen=True)
class Setting:
    """One ``FLEET_*`` setting: its default, the type and range :meth:`FleetConfig.from_settings`
    (or ``MongoConfig``) accepts, one line of meaning, and the page documenting it."""

    name: str
    default: Any
    type: str
    meaning: str
    section: str
    #: the doc page with the full description (docs/settings.md links to it)
    doc: str = "docs/settings.md"


_BP, _POL, _MONGO = "docs/backpressure.md", "docs/politeness.md", "docs/mongo.md"
_STAGES, _BROWSER, _MON = "docs/stages.md", "docs/browser.md", "docs/monitoring.md"
_PROXY = "docs/proxies.md"
_RECRAWL = "docs/recrawl.md"
_SESSIONS = "docs/sessions.md"
_CONTROL = "docs/control.md"

#: Every ``FLEET_*`` setting this package reads: the one source of the defaults
#: (:data:`DEFAULTS`), of ``scrapy fleet settings`` and of the unknown-setting warning.
#: A setting read without a row here is a programming error (:func:`_get` raises KeyError).
SETTINGS: tuple[Setting, ...] = (
    Setting("FLEET_REDIS_URL", "redis://127.0.0.1:6379/0",
            "redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL",
            "Redis of the fleet; the password never appears in logs", "connection"),
    Setting("FLEET_REDIS_TIMEOUT", 10.0, "float > 0",
            "socket connect and read timeout of every Redis call, seconds", "connection"),
    Setting("FLEET_REDIS_RETRIES", 3, "int >= 0",
            "retries of a frontier call after a connection error or timeout", "connection"),
    Setting("FLEET_REDIS_WAIT_REPLICAS", 0, "int >= 0",
            "after a push without a parent, WAIT until this many replicas have it",
            "connection", "docs/deployment.md"),
    Setting("FLEET_CRAWL_ID", None, "str or None (the spider's name)",
            "namespace of the crawl in Redis (1-100 of A-Za-z0-9_.-)", "identity"),
    Setting("FLEET_CRAWL_GROUP", None, "str or None",
            "crawl group (1-100 of A-Za-z0-9_.-): its crawls keep their own queues, filters, "
            "budgets and pauses but share each host's politeness (rate, concurrency, holds, "
            "robots.txt); FLEET_PARTITIONS = 1, not on Redis Cluster", "identity", _CONTROL),
    Setting("FLEET_CRAWL_WEIGHT", 1.0, "float > 0",
            "the crawl's share of each host's leases in its crawl group while several of its "
            "crawls have work there (3 and 1: 75 % and 25 %)", "identity", _CONTROL),
    Setting("FLEET_KEY_PREFIX", "fleet", "str",
            "first part of every key name (1-50 of A-Za-z0-9_.-:)", "identity"),
    Setting("FLEET_WORKER_ID", None, "str or None (<hostname>:<pid>:<start>)",
            "name of this worker in leases and status", "identity"),
    Setting("FLEET_LEASE_TIMEOUT", 30.0, "float >= 1",
            "seconds a leased request stays with a worker without a heartbeat", "frontier"),
    Setting("FLEET_MAX_LEASES", 3, "int >= 1",
            "lease expiries after which a request goes to the dead letters", "frontier"),
    Setting("FLEET_PREFETCH", 16, "int >= 1",
            "requests a worker keeps leased and decoded locally", "frontier"),
    Setting("FLEET_POLL_INTERVAL", 0.5, "float > 0",
            "seconds between polls of an empty frontier", "frontier"),
    Setting("FLEET_FLUSH_INTERVAL", 0.005, "float >= 0",
            "seconds the pump gathers acknowledgements and pushes into one call", "frontier"),
    Setting("FLEET_IDLE_TIMEOUT", None, "float >= 0 or None",
            "close every worker once the fleet is idle this long; None: wait forever",
            "frontier"),
    Setting("FLEET_START_REQUESTS", "once", "once, always or never",
            "who consumes the spider's start requests", "frontier"),
    Setting("FLEET_REQUEST_CLASSES", list(DEFAULT_REQUEST_CLASSES), "list of import paths",
            "Request classes that may be rebuilt from the frontier", "frontier"),
    # issue 21 (partitions): docs/partitions.md
    Setting("FLEET_PARTITIONS", 1, "int, 1-1024",
            "partitions of the crawl's frontier, by host (fixed when the crawl is created)",
            "frontier", "docs/partitions.md"),
    Setting("FLEET_PARTITION_FLUSH", 0.5, "float >= 0",
            "seconds a worker buffers the links it found for another partition before pushing "
            "them (sooner at 100 links, and at close), and the acknowledgements for a "
            "partition it does not call (lease timeout / 4 at most); 0: at every call",
            "frontier", "docs/partitions.md"),
    Setting("FLEET_DUPEFILTER_CAPACITY", 1_000_000, "int >= 1",
            "fingerprints the first Bloom slice holds", "dupefilter"),
    Setting("FLEET_DUPEFILTER_ERROR_RATE", 0.001, "float in (0, 0.5]",
            "false-positive rate of the first Bloom slice", "dupefilter"),
    Setting("FLEET_DUPEFILTER_CACHE", 100_000, "int >= 0",
            "Bloom keys a worker remembers as seen: their links are not sent to Redis; 0: none",
            "dupefilter"),
    Setting("FLEET_QUEUE_MAX", 1_000_000, "int >= 0 or None",
            "bound on the frontier's size, fleet-wide; 0 or None: unbounded", "bounds", _BP),
    Setting("FLEET_QUEUE_LOW_WATERMARK", 0.9, "float in (0, 1)",
            "fraction of FLEET_QUEUE_MAX below which waiting producers resume", "bounds", _BP),
    Setting("FLEET_HOST_QUEUE_MAX", None, "int >= 0 or None",
            "bound on the entries of one host; 0 or None: unbounded", "bounds", _BP),
    Setting("FLEET_BACKPRESSURE_DELAY", 10.0, "float >= 0",
            "seconds a deferred request waits before it is fetched again", "bounds", _BP),
    Setting("FLEET_HOST_RATE", None, "float > 0 or None",
            "requests per second per host, fleet-wide (GCRA)", "politeness", _POL),
    Setting("FLEET_HOST_BURST", 1, "int >= 1", "GCRA burst with FLEET_HOST_RATE",
            "politeness", _POL),
    Setting("FLEET_HOST_DELAY", None, "float >= 0 (the project's DOWNLOAD_DELAY)",
            "minimum seconds between two requests to one host, fleet-wide", "politeness",
            _POL),
    Setting("FLEET_HOST_CONCURRENCY", None,
            "int >= 0 (the project's CONCURRENT_REQUESTS_PER_DOMAIN)",
            "requests in flight to one host, fleet-wide; 0: no cap", "politeness", _POL),
    Setting("FLEET_HOST_OVERRIDES", {}, "dict (JSON on the command line)",
            "per host key: {rate, burst, concurrency, delay, recrawl_interval, budget_pages}",
            "politeness", _POL),
    Setting("FLEET_HOST_KEY", "host", "host, domain or ip", "what counts as one host",
            "politeness", _POL),
    Setting("FLEET_ROBOTSTXT_TTL", 3600.0, "float >= 1",
            "seconds a fetched robots.txt is used by the fleet", "politeness", _POL),
    Setting("FLEET_ROBOTSTXT_HOLD", 60.0, "float >= 0",
            "seconds a host is held when its robots.txt answers 5xx/429 or fails",
            "politeness", _POL),
    Setting("FLEET_ROBOTSTXT_MAX_ATTEMPTS", 4, "int >= 0",
            "failed robots.txt fetches of an origin before its requests fail; 0: never",
            "politeness", _POL),
    Setting("FLEET_MAX_CRAWL_DELAY", None, "float >= 0 or None",
            "cap on a robots.txt Crawl-delay; None: none (a slow host costs the others "
            "nothing)", "politeness", _POL),
    Setting("FLEET_SKIP_CRAWL_DELAY_OVER", None, "float > 0 or None",
            "skip hosts whose robots.txt asks a Crawl-delay over this many seconds: their "
            "requests go to the dead letters (reason crawl_delay); None: none skipped",
            "politeness", _POL),
    Setting("FLEET_BACKOFF_BASE", 1.0, "float > 0",
            "first back-off (seconds) of a failing host without Retry-After", "politeness",
            _POL),
    Setting("FLEET_BACKOFF_MAX", 300.0, "float > 0", "longest back-off (seconds)",
            "politeness", _POL),
    Setting("FLEET_ADAPTIVE", True, "bool",
            "one rate controller per host for the fleet: slows down on overload answers "
            "and rising latency, comes back up to the configured rate", "politeness", _POL),
    Setting("FLEET_ADAPTIVE_BETA", 0.5, "float in (0, 1)",
            "factor of a host's rate on an overload event", "politeness", _POL),
    Setting("FLEET_ADAPTIVE_STEP", 0.05, "float in (0, 1]",
            "rate added after each clean window, as a fraction of the host's configured rate",
            "politeness", _POL),
    Setting("FLEET_ADAPTIVE_WINDOW", 1.0, "float > 0",
            "seconds without overload answers before each increase", "politeness", _POL),
    Setting("FLEET_ADAPTIVE_LATENCY_FACTOR", 2.0, "float >= 1 or 0",
            "slow down when the short latency average exceeds this times the long minimum; "
            "0: no latency rule", "politeness", _POL),
    Setting("FLEET_ADAPTIVE_MIN_RATE", None, "float > 0 or None (0.05)",
            "slowest rate (requests/s) the controller may set; 1 / AUTOTHROTTLE_MAX_DELAY when "
            "AutoThrottle is enabled", "politeness", _POL),
    Setting("FLEET_ADAPTIVE_OVERLOAD_STATUSES", [429, 503], "list of int",
            "HTTP statuses that lower a host's rate (besides timeouts and connection errors)",
            "politeness", _POL),
    Setting("FLEET_ADAPTIVE_MEMORY", 7 * 86400.0, "float >= 0",
            "seconds a host's learned capacity is kept fleet-wide, so that the next crawl or "
            "recrawl of the host starts there; 0: not kept", "politeness", _POL),
    Setting("FLEET_JSONL_PATH", None, "str or None",
            "append one JSON line per item to this file (placeholders %(worker)s...)",
            "sinks"),
    Setting("FLEET_JSONL_FSYNC", False, "bool", "also fsync each JSON line", "sinks"),
    Setting("FLEET_MONGO_URI", None, "str or None",
            "mongodb:// URI; unset: the MongoDB pipeline is disabled", "mongo", _MONGO),
    Setting("FLEET_MONGO_DATABASE", "scrapy", "str", "database name", "mongo", _MONGO),
    Setting("FLEET_MONGO_COLLECTION", None, "str or None (the spider's name)",
            "collection name, a %-template with spider and item_class", "mongo", _MONGO),
    Setting("FLEET_MONGO_ID_FIELDS", ["url"], "list of str",
            "item fields whose values make the stable _id", "mongo", _MONGO),
    Setting("FLEET_MONGO_ID_FUNCTION", None, "callable or import path",
            "f(adapter) -> _id, instead of FLEET_MONGO_ID_FIELDS", "mongo", _MONGO),
    Setting("FLEET_MONGO_BATCH_SIZE", 100, "int, 1-100000",
            "a collection's batch is sent when it holds this many items", "mongo", _MONGO),
    Setting("FLEET_MONGO_FLUSH_INTERVAL", 1.0, "float >= 0",
            "... or when its oldest item waited this long (seconds)", "mongo", _MONGO),
    Setting("FLEET_MONGO_MAX_PENDING", 10_000, "int >= 1",
            "items held by the pipeline at most; more wait (back pressure)", "mongo", _MONGO),
    Setting("FLEET_MONGO_CONCURRENCY", 2, "int >= 1",
            "threads (and batches in flight) running pymongo", "mongo", _MONGO),
    Setting("FLEET_MONGO_RETRY_BACKOFF", 0.5, "float > 0",
            "first delay before retrying a failed batch (seconds)", "mongo", _MONGO),
    Setting("FLEET_MONGO_RETRY_MAX_BACKOFF", 30.0, "float >= FLEET_MONGO_RETRY_BACKOFF",
            "cap of that delay (seconds)", "mongo", _MONGO),
    Setting("FLEET_MONGO_UPDATED_FIELD", "updated_at", "str",
            "field set to the write time on every write", "mongo", _MONGO),
    Setting("FLEET_MONGO_FIRST_SEEN_FIELD", "first_seen_at", "str",
            "field set to the write time when the document is created", "mongo", _MONGO),
    Setting("FLEET_MONGO_TTL", None, "int >= 1 or None",
            "documents not re-written for this many seconds are deleted", "mongo", _MONGO),
    Setting("FLEET_MONGO_UNIQUE_FIELDS", [], "list of str",
            "a unique index on these fields (a secondary key)", "mongo", _MONGO),
    Setting("FLEET_MONGO_CLIENT_FACTORY", None, "callable or import path",
            "f(uri) -> client (default MongoClient(uri, appname='scrapy-fleet'))", "mongo",
            _MONGO),
    Setting("FLEET_FAILED_MAX", 10_000, "int >= 1",
            "failed requests kept for `failed` and `retry`; the oldest are trimmed past it",
            "failures", "docs/failures.md"),
    Setting("FLEET_HEARTBEAT_INTERVAL", 5.0, "float > 0",
            "a worker calls Redis at least this often (seconds), with its heartbeat",
            "monitoring", _MON),
    Setting("FLEET_WORKER_DEAD_AFTER", 6.0, "float > 0",
            "a worker silent this long (seconds) is dead: shown so, and its leases go back "
            "to the frontier", "monitoring", _MON),
    Setting("FLEET_WORKER_FORGET_AFTER", 120.0, "float >= FLEET_WORKER_DEAD_AFTER",
            "a worker silent this long (seconds) leaves the worker list and its keys",
            "monitoring", _MON),
    Setting("FLEET_STALL_AFTER", 120.0, "float > 0",
            "a worker holding leases with no acknowledgement this long is stalled",
            "monitoring", _MON),
    Setting("FLEET_BAN_STATUSES", [403], "list of int",
            "HTTP statuses counted as bans in the fleet-wide counters", "monitoring", _MON),
    Setting("FLEET_DRAIN_TIMEOUT", 30.0, "float >= 0",
            "seconds a SIGTERMed worker lets its requests finish before it releases them",
            "monitoring", _MON),
    Setting("FLEET_ALERT_DEPTH_MINUTES", 10, "int >= 1",
            "alert when the due depth grew for this many minutes", "monitoring", _MON),
    Setting("FLEET_ALERT_BLOCK_RATE", 0.2, "float in [0, 1]",
            "alert when a host's block rate is above this", "monitoring", _MON),
    Setting("FLEET_ALERT_BLOCK_MIN_PAGES", 20, "int >= 1",
            "... once the host has this many responses", "monitoring", _MON),
    Setting("FLEET_ALERT_MEMORY_RATIO", 0.9, "float in (0, 1]",
            "alert when Redis used_memory / maxmemory is above this", "monitoring", _MON),
    Setting("FLEET_PROXIES", None, "list of proxy URLs, a file path, or None",
            "exits added to the crawl's proxy pool when a worker starts; enables the pool",
            "proxies", _PROXY),
    Setting("FLEET_PROXY_POOL", None, "str or None (the crawl id)",
            "name of a proxy pool shared by crawls", "proxies", _PROXY),
    Setting("FLEET_PROXY_MAX_RETRIES", 3, "int >= 0",
            "retries through other exits after a ban; then ProxyBanError", "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_STATUSES", [403], "list of int", "statuses that are a ban",
            "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_PATTERNS", [], "list of regex",
            "a body matching one is a ban (challenge pages)", "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_HEADERS", {}, "dict header -> regex",
            "a matching header value is a ban", "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_POLICY", "scrapy_fleet.proxies.verdicts.BanPolicy", "import path",
            "class asked first for each verdict; may answer None", "proxies", _PROXY),
    Setting("FLEET_PROXY_COOLDOWN_BASE", 30.0, "float > 0",
            "cool-down (seconds) of an (exit, site) after a ban, doubled per ban, jittered",
            "proxies", _PROXY),
    Setting("FLEET_PROXY_COOLDOWN_MAX", 1800.0, "float >= FLEET_PROXY_COOLDOWN_BASE",
            "cap of that cool-down (seconds)", "proxies", _PROXY),
    Setting("FLEET_PROXY_DEAD_AFTER", 3, "int >= 1",
            "proxy_dead verdicts in a row that mark an exit dead fleet-wide", "proxies", _PROXY),
    Setting("FLEET_PROXY_DEAD_RECHECK", 120.0, "float > 0",
            "seconds before a dead exit gets one re-check request", "proxies", _PROXY),
    Setting("FLEET_PROXY_RATE", None, "float > 0 or None",
            "requests per second per exit, fleet-wide (GCRA)", "proxies", _PROXY),
    Setting("FLEET_PROXY_CONCURRENCY", None, "int >= 1 or None",
            "requests in flight per exit, fleet-wide", "proxies", _PROXY),
    Setting("FLEET_PROXY_SESSION_TTL", 600.0, "float >= 1",
            "life (seconds) of a sticky session's binding, renewed on use", "proxies", _PROXY),
    Setting("FLEET_PROXY_TICKET_TTL", None, "float >= 1 or None (DOWNLOAD_TIMEOUT + 60)",
            "seconds an unreported choice holds its exit's in-flight slot", "proxies", _PROXY),
    Setting("FLEET_ROLE", "all", "all, fetch or parse",
            "fetch: store responses for parse workers; parse: parse stored responses",
            "stages", _STAGES),
    Setting("FLEET_RESPONSE_QUEUE_MAX", 1000, "int >= 1",
            "stored responses above which fetch workers lease no more", "stages", _STAGES),
    Setting("FLEET_RESPONSE_QUEUE_BYTES", 256 * 1024 * 1024, "int >= 1",
            "bytes of stored responses above which fetch workers lease no more", "stages",
            _STAGES),
    Setting("FLEET_MAX_STORED_RESPONSE", 8 * 1024 * 1024, "int >= 1",
            "largest stored response (bytes, compressed)", "stages", _STAGES),
    Setting("FLEET_LARGE_RESPONSE", "parse", "parse or fail",
            "a bigger one: parsed by the fetch worker, or failed", "stages", _STAGES),
    Setting("FLEET_PLAYWRIGHT", False, "bool",
            "install scrapy-playwright's download handlers and the asyncio reactor",
            "browser", _BROWSER),
    Setting("FLEET_PLAYWRIGHT_ABORT", ["image", "media", "font"], "list of resource types",
            "browser sub-requests not loaded (they bypass the fleet's politeness)", "browser",
            _BROWSER),
    # recrawl (issue 22): tracked pages come back into the frontier when due
    Setting("FLEET_RECRAWL", "off", "off, fixed or adaptive",
            "revisit every page fetched with a 2xx: at a fixed interval, or as often as it "
            "changes", "recrawl", _RECRAWL),
    Setting("FLEET_RECRAWL_INTERVAL", 86400.0, "float >= 1",
            "seconds to a page's first revisit (fixed: every revisit)", "recrawl", _RECRAWL),
    Setting("FLEET_RECRAWL_MIN_INTERVAL", 3600.0, "float >= 1",
            "shortest interval the adaptive policy gives a page (seconds)", "recrawl",
            _RECRAWL),
    Setting("FLEET_RECRAWL_MAX_INTERVAL", 30 * 86400.0, "float >= FLEET_RECRAWL_MIN_INTERVAL",
            "longest interval the adaptive policy gives a page (seconds)", "recrawl",
            _RECRAWL),
    Setting("FLEET_RECRAWL_MAX", 10_000_000, "int >= 0 or None (0 or None: unbounded)",
            "tracked URLs at most; past it a newly fetched page is not tracked (counted)",
            "recrawl", _RECRAWL),
    Setting("FLEET_RECRAWL_GONE_AFTER", 2, "int >= 1",
            "404/410 answers in a row after which a URL leaves the schedule", "recrawl",
            _RECRAWL),
    Setting("FLEET_RECRAWL_BUDGET", 0.8, "float 0 .. 1",
            "adaptive: the share of a host's rate its revisits may take (0: no budget)",
            "recrawl", _RECRAWL),
    Setting("FLEET_RECRAWL_ITEMS", "changed", "changed or all",
            "items of a revisited page sent to the pipelines: only when its items changed, "
            "or always", "recrawl", _RECRAWL),
    Setting("FLEET_RECRAWL_IGNORE_FIELDS", [], "list of str",
            "item fields left out of the comparison of a page's items (a fetch time)",
            "recrawl", _RECRAWL),
    Setting("FLEET_RECRAWL_NEAR_DUPLICATES", False, "bool",
            "a page without items: compare its text by simhash (numbers left out, 3 bits "
            "apart are one version) instead of every word", "recrawl", _RECRAWL),
    # sessions (issue 32): Scrapy's cookie jars are fleet state (sessions/)
    Setting("FLEET_COOKIES", True, "bool",
            "cookie jars (meta[\"cookiejar\"]) in Redis, shared by every worker; False: "
            "Scrapy's per-process CookiesMiddleware", "sessions", _SESSIONS),
    Setting("FLEET_COOKIE_MAX_BYTES", 4096, "int >= 64",
            "largest cookie a jar stores (name, value, domain, path; bytes); a larger one "
            "fails its request (cookie/too_large)", "sessions", _SESSIONS),
    Setting("FLEET_SESSION_POOL_SIZE", 0, "int >= 0",
            "sessions per pool (a pool per site, or meta[\"fleet_session_pool\"]); a "
            "request draws the least used; 0: no pools (meta[\"cookiejar\"] as in Scrapy)",
            "sessions", _SESSIONS),
    Setting("FLEET_SESSION_MAX_USES", 0, "int >= 0",
            "requests a session serves before it is retired and replaced (0: no limit)",
            "sessions", _SESSIONS),
    Setting("FLEET_SESSION_MAX_AGE", 0.0, "float >= 0",
            "seconds a session lives before it is retired and replaced (0: no limit)",
            "sessions", _SESSIONS),
    Setting("FLEET_SESSION_RETIRE_STATUSES", [401, 403], "list of int",
            "HTTP statuses that retire their session (the request is retried once on "
            "another)", "sessions", _SESSIONS),
    Setting("FLEET_SESSION_MAX_ERRORS", 3, "int >= 0",
            "failed validity checks in a row (one per login) that retire a session "
            "(0: never)", "sessions", _SESSIONS),
    Setting("FLEET_SESSION_LOGIN_TIMEOUT", 60.0, "float > 0",
            "seconds a worker's claim on a session's login lasts; a dead worker's claim "
            "is taken over after it", "sessions", _SESSIONS),
    Setting("FLEET_SESSION_INHERIT", True, "bool",
            "requests yielded from a session's response, to the same pool, keep that "
            "session (False: they draw from the pool)", "sessions", _SESSIONS),
    Setting("FLEET_SESSION_MAX_IDLE", 0.0, "float >= 0",
            "seconds a session may go unused (since its last use, or its creation) before "
            "it is retired (idle) when it next comes up; 0: no limit", "sessions", _SESSIONS),
    Setting("FLEET_SESSION_CONCURRENCY", 1, "int >= 0",
            "requests of one session in flight at once, fleet-wide (0: no cap); a third "
            "politeness scope beside the host and the proxy exit", "sessions", _SESSIONS),
    Setting("FLEET_SESSION_DELAY", 0.0, "float >= 0",
            "seconds between the starts of two requests of one session, fleet-wide (GCRA, "
            "burst 1); 0: none", "sessions", _SESSIONS),
    # budgets (issue 34): charged by the lease step (lua/step_budget.lua, budget_settings.py)
    Setting("FLEET_BUDGET_PAGES", None, "int > 0 or None (CLOSESPIDER_PAGECOUNT carries over)",
            "pages the whole crawl may lease, charged at lease time; then every worker closes "
            "with reason budget_pages; at FLEET_PARTITIONS > 1 the partitions reserve it in "
            "chunks (at most 64 pages)", "budgets", _CONTROL),
    Setting("FLEET_BUDGET_SECONDS", None, "float > 0 or None (CLOSESPIDER_TIMEOUT carries over)",
            "seconds of Redis's clock from the crawl's first lease after which nothing is "
            "leased; then every worker closes with reason budget_seconds; FLEET_PARTITIONS = 1 "
            "only", "budgets", _CONTROL),
    Setting("FLEET_BUDGET_ITEMS", None, "int > 0 or None (CLOSESPIDER_ITEMCOUNT carries over)",
            "items scraped fleet-wide (as the workers report them) after which nothing more is "
            "leased; every worker closes with reason budget_items once nothing is in flight "
            "(the items of pages in flight overshoot it); FLEET_PARTITIONS = 1 only",
            "budgets", _CONTROL),
    Setting("FLEET_BUDGET_BYTES", None, "int > 0 or None",
            "response bytes fleet-wide (as the workers report them) after which nothing more "
            "is leased; every worker closes with reason budget_bytes once nothing is in "
            "flight (the pages in flight overshoot it); FLEET_PARTITIONS = 1 only",
            "budgets", _CONTROL),
    Setting("FLEET_HOST_BUDGET_PAGES", None, "int > 0 or None",
            "pages each host may lease (FLEET_HOST_OVERRIDES' budget_pages for one host); a "
            "host out of budget keeps its queue and is not served", "budgets", _CONTROL),
)

#: name -> default of every setting (from :data:`SETTINGS`)
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}
assert len(DEFAULTS) == len(SETTINGS), "a setting is listed twice"


def unknown_settings(names: Any) -> list[tuple[str, str | None]]:
    """``(name, closest known setting or None)`` for each ``FLEET_*`` name among *names*
    (a settings object or any iterable of names) that no row of :data:`SETTINGS` knows: a
    typo (one letter too many, say) would otherwise be ignored silently.  The closest name
    is :func:`difflib.get_close_matches`' best (ratio >= 0.6)."""
    import difflib

    out = []
    for name in sorted({str(n) for n in names}):
        if name.startswith("FLEET_") and name not in DEFAULTS:
            close = difflib.get_close_matches(name, DEFAULTS, n=1)
            out.append((name, close[0] if close else None))
    return out


def format_default(value: Any) -> str:
    """*value* as one would write it in settings.py (``None``, ``10.0``, ``"once"``...)."""
    return repr(value).replace("'", '"')


def settings_listing() -> str:
    """Plain-text table of every setting (``scrapy fleet settings``): name, type, default and
    one line of meaning, by section, from :data:`SETTINGS`."""
    width = max(len(s.name) for s in SETTINGS)
    lines = []
    for section in SECTIONS:
        rows = [s for s in SETTINGS if s.section == section]
        if not rows:
            continue
        lines.append(f"{section} (details: {rows[0].doc})")
        for s in rows:
            lines.append(f"  {s.name:<{width}}  {s.type}; default {format_default(s.default)}")
            lines.append(f"  {'':<{width}}  {s.meaning}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
