"""Every Redis key name of a crawl is built here, and only here.

All keys of one crawl share the hash tag ``{<crawl id>}`` so that the multi-key Lua scripts can
run on Redis Cluster (every key of a script must live in one slot).  Layout, with the default
prefix ``fleet`` and crawl id ``docs``::

    fleet:{docs}:qb:<host>\t<priority key>  LIST  "<entry id>\t<bytes>"  queued requests of one
                                                              host and priority (a bucket), FIFO:
                                                              the encoded request (codec.py) is
                                                              in the entry (lua/hosts.lua)
    fleet:{docs}:qidx         HASH  host -> "<priority key> ..."  the priority keys of the
                                                              host's buckets that hold entries,
                                                              ascending (best first)
    fleet:{docs}:qn           STRING  count                   entries in the buckets
    fleet:{docs}:data         HASH  entry id -> bytes         encoded request of a leased or
                                                              deferred entry (codec.py)
    fleet:{docs}:leases       ZSET  entry id -> expiry (ms)   leased requests, by server time
    fleet:{docs}:lease        HASH  entry id -> "token|score|host\tworker"  current lease of
                                                              each entry ("!worker": download
                                                              over)
    fleet:{docs}:expiries     HASH  entry id -> count         lease expiries of an entry so far
    fleet:{docs}:dead         HASH  entry id -> msgpack       dead letters {reason, at, data}
    fleet:{docs}:deferred     ZSET  "id|score|host" -> ready (ms)  deferred requests (back
                                                              pressure)
    fleet:{docs}:next_due     STRING  ms                      nothing in deferred or leases is
                                                              scored before it (a lower bound:
                                                              lua/step_begin.lua)
    fleet:{docs}:parked       LIST  msgpack [id, score, host, data]  parked requests (outside the
                                                              size), oldest first
    fleet:{docs}:hostq        HASH  host -> count             entries per host in the frontier
    fleet:{docs}:ready        ZSET  host -> time (ms)         hosts with queued entries, by the
                                                              time they may be fetched again
    fleet:{docs}:tat          HASH  host -> ms                GCRA theoretical arrival time
    fleet:{docs}:hold         HASH  host -> ms                back-off: no request before then
    fleet:{docs}:hostlive     HASH  host -> count             leased, download not over
    fleet:{docs}:hostconf     HASH  host -> "T|burst|cap"     per-host overrides
    fleet:{docs}:crawldelay   HASH  host -> ms                robots.txt Crawl-delay
    fleet:{docs}:adaptive     HASH  host -> "r|ls|lm|..."     adaptive politeness controller
                                                              (learned rate, latency, last
                                                              decrease; lua/adaptive.lua)
    fleet:{docs}:wlive        HASH  "worker|host" -> count    leases of a worker for a host
    fleet:{docs}:budget       HASH  pages, seconds, charged,  crawl budgets (issue 34: the
                                    deadline                  command's numbers, pages charged,
                                                              the time budget's end, ms)
    fleet:{docs}:budgeth      HASH  "c|<host>", "s|<host>",   per-host page budgets: the
                                    "n|<host>" -> count       command's, FLEET_HOST_OVERRIDES',
                                                              pages charged (lua/step_budget.lua)
    fleet:{docs}:fails        HASH  host -> count             consecutive failures (back-off)
    fleet:{docs}:robots       HASH  origin -> msgpack         shared robots.txt {status, body, at,
                                                              fails, next, gone, err}; and
                                    host -> origin            the host is known (no scouting)
    fleet:{docs}:robots_lock  HASH  origin -> "owner|until"   who fetches an origin's robots.txt
    fleet:{docs}:config       HASH    the workers' bounds     queue_max, low_watermark, ...,
                                      and per-host defaults   host_interval_ms, host_burst,
                                                              host_concurrency, ...
    fleet:{docs}:rvi          ZSET  slot -> due (ms)          recrawl schedule's slots (recrawl)
    fleet:{docs}:rv:<slot>    LIST  "<host>\t<score>\t<bytes>"  tracked URLs due in that slot
    fleet:{docs}:rvn          STRING  count                   tracked URLs
    fleet:{docs}:rvp          HASH  slot -> count             records LPOPped from a slot so far
    fleet:{docs}:rvx:<b>      HASH  fp[2:8] -> place          where a tracked URL's record is
                                                              (b: 4 hex digits of fp[0:2]; place:
                                                              slot, position, last fetch)
    fleet:{docs}:rvl          STRING  "1"                     a push carried a sitemap <lastmod>:
                                                              records are indexed in rvx
    fleet:{docs}:rvb:<host>   HASH  bucket -> pages, "mu" -> price  a host's tracked pages by
                                                              change rate, and its price of a
                                                              fetch (recrawl/budget.py)
    fleet:{docs}:rvh          SET   host                      the hosts with an rvb HASH (status
                                                              --hosts' recrawl table)
    fleet:{docs}:seq          STRING  counter                 entry ids
    fleet:{docs}:sf:<p>       STRING  bits                    partitions with stages: bit n set
                                                              when a stored response of entry n
                                                              of partition p was queued here
                                                              (lua/push_lean.lua: one per entry)
    fleet:{docs}:token        STRING  counter                 fencing tokens
    fleet:{docs}:bloom:meta   HASH    Bloom filter parameters, per-slice counts, generation g
    fleet:{docs}:bloom:N      STRING  bits of Bloom slice N (N = 0 .. BLOOM_MAX_SLICES-1)
    fleet:{docs}:stats        HASH    fleet-wide counters (pushed, leased, acked, ...)
    fleet:{docs}:idle_since   STRING  server time (ms) the fleet became idle
    fleet:{docs}:seeding      HASH    who consumes the start requests: holder, until (ms),
                                      progress (start requests handed on), done
    fleet:{docs}:workers      ZSET    worker id -> last heartbeat (ms)
    fleet:{docs}:workers_first  STRING  ms                    no score in workers is before it
                                                              (a lower bound: lua/monitoring.lua)
    fleet:{docs}:holders      ZSET    worker id -> last sign of life (ms)  workers that took
                                      leases; one silent for FLEET_WORKER_DEAD_AFTER is dead
                                      and its leases are reclaimed (lua/step_recover.lua)
    fleet:{docs}:held         ZSET    "<worker id>\t<entry id>" (score 0)  each lease under its
                                      holder, read by lex range when the holder is dead
    fleet:{docs}:alive_from   STRING  ms                      liveness counts from here: set
                                      when no worker had reached Redis for
                                      FLEET_WORKER_DEAD_AFTER (an outage), so that none is
                                      taken for dead when it comes back (lua/beat.lua)
    fleet:{docs}:ctl          STRING  "<gen>|<until>|<hosts>"  crawl control (issue 34): its
                                      generation, the crawl's pause (-1 running, 0 until
                                      resumed, else until that ms) and paused hosts' count
    fleet:{docs}:control      HASH    the crawl's pause: gen, until, by, at, why
    fleet:{docs}:ctlhosts     HASH  host -> "<until>|<kind>|<by>|<at>|<why>"  paused or
                                      blocked hosts (lua/step_control.lua)
    fleet:{docs}:ctlseen      HASH  worker id -> gen          the control generation each
                                                              worker holds (its calls say)
    fleet:{docs}:ctlhostconf  HASH  host -> "T|burst|cap|rate"  live overrides (host set),
                                                              above hostconf part by part
    fleet:{docs}:failed       HASH  entry id -> msgpack       failed requests {url, method, reason,
                                                              status, attempts, worker, at, data}
    fleet:{docs}:failed_at    ZSET  entry id -> time (ms)     failed requests, oldest first (cap)
    fleet:{docs}:failed_by    HASH  reason -> count           failed requests kept, per reason
    fleet:{docs}:marker       STRING  crawl marker (random id) written by the first frontier
                                      call; its loss means Redis lost the crawl's state
    fleet:{docs}:spider       STRING  "<spider name>\t<class path>": the spider the crawl belongs
                                      to, written once (SET NX) by its first worker or push
                                      (identity.py)
    fleet:{docs}:claim:<id>   STRING  "<host>\t<pid>\t<start>": the last worker that started
                                      with worker id <id>; expires FLEET_WORKER_DEAD_AFTER
                                      after its start (identity.py)
    fleet:{docs}:layout       STRING  LAYOUT_VERSION of the crawl's keys, written with the
                                      marker; a crawl of another layout is refused at start
                                      (frontier/layout.py)
    fleet:{docs}:op:<op id>   STRING  cached reply of a mutating script (safe retries), short TTL
    fleet:{docs}:worker:<id>  HASH    heartbeat of one worker (state, leases, pages, versions,
                                      last seen..., hd: SHA1 of the heartbeat last written),
                                      rewritten when it changed or once a second, expires
                                      FLEET_WORKER_FORGET_AFTER after its last write
                                      (docs/monitoring.md)
    fleet:{docs}:mon          HASH    monitoring state: last sampled slot per tier (s1 s2 s3),
                                      last acknowledgement (la), last worker call (lw), t0
    fleet:{docs}:series:<tier> STRING ring buffer of samples of one tier (10s, 1m, 10m): fixed
                                      size, slot (t / step) mod points (monitoring/series.py)
    fleet:{docs}:hoststats    HASH    "p|host" responses, "b|host" bans, "f|host" first ban (ms)
    fleet:{docs}:hostbans     ZSET    host -> bans (the most banned hosts, in O(log n))
    fleet:{docs}:jar:<S>      HASH  "<domain>\t<path>\t<name>" -> "<expiry ms or 0>\t<JSON>"
                                                              the cookie jar of session S
                                                              (Scrapy's meta["cookiejar"]),
                                                              one field per cookie, expiry by
                                                              the server's clock (0: a session
                                                              cookie); under the crawl's own
                                                              tag, or with P > 1 split by site
                                                              (registered domain) into the
                                                              site's partition
                                                              (:meth:`CrawlKeys.site_cookie_jar`,
                                                              lua/cookies_merge.lua)
    fleet:{docs}:spools       SET     names of the session pools (sessions/pool.py)
    fleet:{docs}:spool:<P>    ZSET    session id -> uses: the drawable (not retired) sessions
                                      of pool P, least used first (lua/sessions.lua)
    fleet:{docs}:spoolinfo:<P> HASH   pool P's counters: next (last session number), created,
                                      logins, check_failed, retired:<reason>
    fleet:{docs}:sess:<ID>    HASH    record of session ID ("<pool part>-<n>"): pool, state
                                      (new/relogin/active/retired), reason, uses, errors,
                                      created, last_used, retired_at (ms), generation, jar,
                                      exit (the proxy exit id it is bound to, "" none),
                                      bound_at, owner, owner_until, tat (GCRA theoretical
                                      arrival time of its delay, ms)
    fleet:{docs}:sslots:<ID>  ZSET    ticket -> expiry (ms): the requests of session ID in
                                      flight, at most FLEET_SESSION_CONCURRENCY
                                      (lua/sessions.lua take/give; no TTL: empty
                                      when none is in flight, a dead worker's
                                      tickets dropped by the next take)

Entry ids are the 15-digit, zero-padded value of ``seq``: lexicographic order is push order.

Crawl groups (``FLEET_CRAWL_GROUP``, issue 34, docs/control.md "Crawl groups"): the politeness
keys of a crawl in group ``shop`` (``tat hold hostlive hostconf crawldelay fails robots
robots_lock adaptive``) are the group's, under the tag ``{group:shop}`` (``:`` is never in a
crawl id), shared by every crawl of the group; the rest stays under the crawl's tag::

    fleet:{group:shop}:tat    ... as listed above, one of each for the whole group
    fleet:{group:shop}:gs:<host>  HASH  p|<crawl> pass, t|<crawl> last want (ms), w|<crawl>
                                        weight: how the crawls share the host's turns
                                        (lua/step_group.lua)

A frontier call of such a crawl touches two hash tags, hence a group needs P = 1 on one Redis
(group_settings.py refuses it at P > 1 and on Redis Cluster).

Partitions (``FLEET_PARTITIONS`` = P > 1, docs/partitions.md): the crawl's frontier is split by
host into P partitions, each a complete frontier of the layout above under its own hash tag
``{<crawl id>/<p>.<salt>}`` (:func:`partition_tag`; ``/`` is never in a crawl id), the host of
a URL in partition :func:`partition_of` (CRC32 of its host key, mod P).  The salt puts the
tag's cluster slot in the middle half of the p-th of P equal slot ranges, so that a Redis
Cluster created with equal ranges per master holds P/N partitions per master.  The crawl's own
tag ``{<crawl id>}`` is then the control tag: ``partitions`` (P, written once when the crawl
is created), ``spider``, ``claim:*``, ``seeding``, ``config``, and the per-worker keys of the
commands.  P = 1 is the layout above, unchanged (no ``partitions`` key)::

    fleet:{docs}:partitions   STRING  P                       partitions of a crawl with P > 1
    fleet:{docs/3.17}:qb:...  the frontier keys of partition 3 (salt 17), as listed above

The KEYS of a script are declared once, as a tuple of names (``FRONTIER_CALL``, ``RETRY_CALL``,
``SAMPLE_CALL``): :meth:`CrawlKeys.call_keys` builds the KEYS list from it, and lua/__init__.py
the script's prologue, a table ``K`` of the same names bound to their ``KEYS[i]``.  No key
position is written anywhere else.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

from scrapy_fleet.checks import validate_crawl_id

#: the frontier's pseudo-host of stored responses (stages/records.py, lua/hosts.lua)
STAGE_HOST = "~parse"

#: Slices a scalable Bloom filter may grow to (slice N holds capacity * 2**N fingerprints, so
#: 12 slices hold 4095 times FLEET_DUPEFILTER_CAPACITY).
BLOOM_MAX_SLICES = 12

#: The layout of a crawl's keys (this module's docstring), stored in its ``layout`` key when
#: the crawl is created.  A crawl without that key (written before it existed: layout 1, the
#: queue ZSET and the ``ehost`` hash) or of another version is refused at start.
LAYOUT_VERSION = 3

#: TEST ONLY: the key holding the offset (ms) the test clock adds to Redis TIME in every
#: script's ``server_now_ms()`` while a test has it on (lua/test_clock.lua,
#: ``lua.sources.set_test_clock``); never read by a production script.
TEST_CLOCK_KEY = "fleet-test:clock_offset_ms"

#: The monitoring keys of a call (lua/monitoring.lua), last in the calls that carry them.
MONITOR_CALL = ("worker_info", "mon", "series_10s", "series_1m", "series_10m", "hoststats",
                "hostbans")

#: The control keys the frontier call reads (issue 34, lua/step_control.lua).
CONTROL_READ = ("ctl", "ctlhosts", "ctlseen", "ctlhostconf")

#: KEYS of lua/control.lua, in order (the commands pause, resume and host: commands/control.py).
CONTROL_CALL = ("ctl", "control", "ctlhosts", "ready", "hostq", "ctlhostconf")

#: KEYS of lua/frontier.lua, in order.  The Bloom slices come last: a call without pushes
#: leaves them out (CrawlKeys.frontier_keys), since only a push reads them.
FRONTIER_CALL = ("op", "prev_op", "data", "leases", "lease", "expiries", "dead", "seq", "token",
                 "stats", "idle_since", "workers", "deferred", "parked", "hostq", "ready", "tat",
                 "hold", "hostlive", "hostconf", "crawldelay", "wlive", "robots", "failed",
                 "failed_at", "failed_by", "marker", "layout", "queue_index", "queue_count",
                 "bucket_prefix", "bloom_meta", "next_due", "workers_first",
                 # recovery (issue 30): a dead worker's leases back (lua/step_recover.lua)
                 "holders", "held", "alive_from",
                 # recrawl (issue 22): lua/step_revisit.lua
                 "revisit_index", "revisit_prefix", "revisit_count",
                 # sitemap <lastmod> (issue 22): lua/step_revisit.lua, revisit_lastmod_due
                 "revisit_popped", "revisit_place_prefix", "revisit_lastmod",
                 "adaptive",  # adaptive politeness (issue 35): lua/adaptive.lua
                 "group_share_prefix",  # crawl groups (issue 34): lua/step_group.lua
                 "budget", "budgeth",  # budgets (issue 34): lua/step_budget.lua
                 # crawl control (issue 34): lua/step_control.lua
                 *CONTROL_READ,
                 *MONITOR_CALL, "bloom_slices")

#: KEYS of lua/failed_retry.lua, in order.
RETRY_CALL = ("failed", "failed_at", "failed_by", "dead", "hostq", "stats", "seq", "leases",
              "deferred", "queue_index", "queue_count", "bucket_prefix", "ready")

#: KEYS of lua/host_drop.lua, in order (``host drop``: a host's queue in bounded slices).
DROP_CALL = ("queue_index", "queue_count", "bucket_prefix", "hostq", "ready", "dead", "stats",
             "seq")

#: KEYS of lua/politeness.lua, in order.
POLITENESS_CALL = ("ready", "tat", "hold", "hostlive", "hostconf", "crawldelay", "fails", "robots",
                   "robots_lock", "adaptive")

#: KEYS of lua/beat.lua, in order (a worker's sign of life, sent from a thread: issue 30).
BEAT_CALL = ("workers", "holders", "mon", "alive_from")

#: KEYS of lua/seeding.lua.
SEEDING_CALL = ("seeding",)

#: KEYS of lua/startkey.lua, in order (a scrapy-redis spider's start key: StartKeyKeys).
START_KEY_CALL = ("start", "taking", "deadlines", "bad")

#: KEYS of lua/bloom_add.lua, in order.
BLOOM_ADD_CALL = ("op", "prev_op", "bloom_meta", "bloom_slices")

#: KEYS of lua/push_lean.lua, in order (partitions: a push without lease or ack).
PUSH_LEAN_CALL = ("op", "prev_op", "marker", "layout", "stats", "seq", "data", "leases",
                  "deferred", "parked", "hostq", "idle_since", "queue_index", "queue_count",
                  "bucket_prefix", "ready", "bloom_meta", "bloom_slices", "next_due",
                  # sitemap <lastmod> (issue 22): a known URL made due (lua/step_revisit.lua)
                  "revisit_prefix", "revisit_popped", "revisit_place_prefix", "revisit_lastmod",
                  # stages: one stored response per entry of another partition
                  "stored_from_prefix")

#: KEYS of lua/partition_probe.lua, in order (partitions: one partition's state, read-mostly).
PROBE_CALL = ("queue_count", "leases", "deferred", "parked", "idle_since", "marker",
              "revisit_index")

#: KEYS of lua/sample.lua, in order.
SAMPLE_CALL = ("stats", "workers", "leases", "deferred", "parked", "dead", "queue_count",
               *MONITOR_CALL)


def key_width(name: str) -> int:
    """How many KEYS the declared name stands for (the Bloom slices: BLOOM_MAX_SLICES)."""
    return BLOOM_MAX_SLICES if name == "bloom_slices" else 1


class _Key:
    """A fixed key name of a crawl or pool, read as an attribute: ``keys.leases`` is
    ``<base>:leases`` (the owner's ``base``); its doc is the ``#:`` comment above it."""

    __slots__ = ("suffix",)

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, obj: CrawlKeys | ProxyPoolKeys | StartKeyKeys,
                owner: type | None = None) -> str:
        return f"{obj.base}:{self.suffix}"


class _PoliteKey(_Key):
    """A politeness key of a crawl (a host's rate, holds, concurrency, robots.txt): under
    the crawl group's tag when the crawl is in one (:attr:`CrawlKeys.politeness_base`)."""

    __slots__ = ()

    def __get__(self, obj: CrawlKeys | ProxyPoolKeys | StartKeyKeys,
                owner: type | None = None) -> str:
        if isinstance(obj, CrawlKeys):
            return f"{obj.politeness_base}:{self.suffix}"
        return f"{obj.base}:{self.suffix}"


@dataclass(frozen=True)
class CrawlKeys:
    """Key names of one crawl (see module docstring)."""

    prefix: str
    crawl_id: str
    #: the hash tag of one partition (:func:`partition_tag`); "" for the crawl's own tag
    tag: str = ""
    #: the partition's index (0 .. P - 1; 0 for the crawl's own tag)
    part: int = 0
    #: FLEET_CRAWL_GROUP ("": none): the crawls of a group share each host's politeness
    #: keys, under the tag ``{group:<name>}`` (docs/control.md "Crawl groups"; P = 1 only)
    group: str = ""

    def __post_init__(self) -> None:
        validate_crawl_id(self.crawl_id)
        if self.group:
            validate_crawl_id(self.group, "FLEET_CRAWL_GROUP")

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.tag or self.crawl_id}}}"

    @property
    def politeness_base(self) -> str:
        """Where the politeness keys live: ``<prefix>:{group:<group>}`` for a crawl in a
        group (``:`` is never in a crawl id, so no crawl's tag is a group's), else
        :attr:`base`."""
        return f"{self.prefix}:{{group:{self.group}}}" if self.group else self.base

    #: STRING: P, the partitions of a crawl created with FLEET_PARTITIONS > 1 (control).
    partitions = _Key("partitions")

    def partition(self, p: int, parts: int) -> CrawlKeys:
        """The keys of partition *p* of *parts* (this crawl's own keys when *parts* is 1)."""
        if parts == 1:
            return CrawlKeys(self.prefix, self.crawl_id, group=self.group)
        return CrawlKeys(self.prefix, self.crawl_id, partition_tag(self.crawl_id, p, parts), p)

    def all_partitions(self, parts: int) -> list[CrawlKeys]:
        """The keys of every partition, in order (``[own keys]`` when *parts* is 1)."""
        return [self.partition(p, parts) for p in range(parts)]

    def _k(self, name: str) -> str:
        return f"{self.base}:{name}"

    queue_index = _Key("qidx")
    queue_count = _Key("qn")

    #: Prefix of the queue buckets' key names (passed to the scripts as a key: every bucket
    #: shares the crawl's hash tag, so it lives in the same cluster slot).
    bucket_prefix = _Key("qb:")

    def bucket(self, host: str, priority: int) -> str:
        """The queue bucket of *host*'s entries of Request.priority *priority* (lua/hosts.lua,
        bucket_name: the key is -priority + 10**15, zero-padded to 16 digits)."""
        return f"{self.bucket_prefix}{host}\t{-priority + 10**15:016d}"

    data = _Key("data")

    # recrawl (issue 22): the schedule of tracked URLs (lua/step_revisit.lua)
    #: ZSET slot -> due time (ms): the schedule's slots that hold records.
    revisit_index = _Key("rvi")

    #: Prefix of the schedule's slot LISTs (records ``<host>\t<score>\t<request>``).
    revisit_prefix = _Key("rv:")

    def revisit_slot(self, name: str) -> str:
        """The LIST of schedule slot *name* (a member of :attr:`revisit_index`)."""
        return f"{self.revisit_prefix}{name}"

    #: STRING: tracked URLs (scheduled, or in the frontier as a revisit).
    revisit_count = _Key("rvn")

    #: HASH slot -> records LPOPped from it so far (a record's absolute position in its slot
    #: is this count plus its index in the LIST); the field leaves with its slot.
    revisit_popped = _Key("rvp")

    #: Prefix of the place index's HASHes (sitemap ``<lastmod>``): ``rvx:<4 hex digits of the
    #: Bloom key's first 2 bytes>``, field: the key's next 6 bytes, value: the record's place
    #: (lua/step_revisit.lua).
    revisit_place_prefix = _Key("rvx:")

    def revisit_place(self, bloom_key: bytes) -> tuple[str, bytes]:
        """The place index's HASH and field of the URL of Bloom key *bloom_key* (12 bytes)."""
        return f"{self.revisit_place_prefix}{bloom_key[:2].hex()}", bloom_key[2:8]

    #: STRING "1": a push carried a sitemap ``<lastmod>``: records are indexed from then on.
    revisit_lastmod = _Key("rvl")

    #: Prefix of the hosts' budget HASHes (recrawl/budget.py).
    revisit_budget_prefix = _Key("rvb:")

    def revisit_budget(self, host: str) -> str:
        """HASH of *host*'s tracked pages by change-rate bucket and its price ``mu``."""
        return f"{self.revisit_budget_prefix}{host}"

    #: SET of the hosts that have a budget HASH (recrawl/budget.py adds each host it syncs;
    #: status --hosts lists the recrawl's hosts from it: recrawl/view.py).
    revisit_hosts = _Key("rvh")

    #: Prefix of the bitmaps ``sf:<p>`` of the stored responses' partition (stages on a
    #: partitioned crawl): bit *n* set when a stored response of entry *n* (its id's digits)
    #: of partition *p* was queued, so that a second fetch of that entry (the first worker's
    #: lease lost) queues none (lua/push_lean.lua).
    stored_from_prefix = _Key("sf:")

    def stored_from(self, p: int) -> str:
        """The bitmap of the stored responses queued here for the entries of partition *p*."""
        return f"{self.stored_from_prefix}{p}"

    # -- crawl control (issue 34: pause, resume, host block; docs/control.md) ---------------
    #: STRING ``"<gen>|<until>|<hosts>"``: the control generation, the crawl's pause (-1:
    #: running; 0: paused until resumed; else paused until that server time, ms) and how many
    #: hosts are paused; missing: no control was ever used (lua/step_control.lua)
    ctl = _Key("ctl")
    #: HASH of the crawl's pause: gen, until, by, at (ms), why
    control = _Key("control")
    #: HASH host -> ``"<until>|<kind>|<by>|<at>|<why>"`` (until 0: until unblocked or resumed;
    #: kind ``pause`` or ``block``)
    ctlhosts = _Key("ctlhosts")
    #: HASH worker id -> the control generation it holds (its calls report it)
    ctlseen = _Key("ctlseen")
    #: HASH host -> ``"T|burst|cap|rate"``: live overrides (``host set``), part by part above
    #: the ``hostconf`` of FLEET_HOST_OVERRIDES (empty parts keep it; lua/hosts.lua)
    ctlhostconf = _Key("ctlhostconf")

    def control_keys(self) -> list[str]:
        """KEYS of lua/control.lua (CONTROL_CALL)."""
        return self.call_keys(CONTROL_CALL)

    leases = _Key("leases")
    lease = _Key("lease")
    expiries = _Key("expiries")
    dead = _Key("dead")
    deferred = _Key("deferred")
    next_due = _Key("next_due")
    workers_first = _Key("workers_first")
    #: workers that took leases -> their last sign of life (ms): lua/step_recover.lua
    holders = _Key("holders")
    #: "<worker id>\t<entry id>" of each lease (score 0), by holder: lua/step_recover.lua
    held = _Key("held")
    #: server time (ms) from which liveness counts (set after a gap: an outage)
    alive_from = _Key("alive_from")
    parked = _Key("parked")
    hostq = _Key("hostq")
    ready = _Key("ready")
    tat = _PoliteKey("tat")
    hold = _PoliteKey("hold")
    hostlive = _PoliteKey("hostlive")
    hostconf = _PoliteKey("hostconf")
    crawldelay = _PoliteKey("crawldelay")
    #: HASH host -> "r|ls|lm|lmt|dt|dk|why|ct|cap|cc|n": the host's adaptive politeness
    #: controller (lua/adaptive.lua), fleet-wide; kept with the crawl, so a recrawl or the
    #: crawl's next run starts at the rate it learned
    adaptive = _PoliteKey("adaptive")
    wlive = _Key("wlive")

    # budgets (issue 34, docs/control.md "Budgets"; lua/step_budget.lua)
    #: HASH: ``pages`` / ``seconds``, the crawl's budgets set by ``scrapy fleet budget``
    #: (above FLEET_BUDGET_PAGES / FLEET_BUDGET_SECONDS); ``charged``, pages charged at lease
    #: time; ``deadline``, ms on Redis's clock after which nothing is leased (set at the first
    #: lease of a crawl with a time budget)
    budget = _Key("budget")
    #: HASH ``c|<host>`` -> the host's page budget set by ``scrapy fleet budget --host``,
    #: ``s|<host>`` -> its FLEET_HOST_OVERRIDES ``budget_pages``, ``n|<host>`` -> its pages
    #: charged (one HMGET reads a host's three)
    budgeth = _Key("budgeth")

    #: Prefix of the HASHes ``gs:<host>`` of a crawl group's lease shares of one host
    #: (FLEET_CRAWL_WEIGHT): ``p|<crawl>`` its pass (leases / weight, stride scheduling),
    #: ``t|<crawl>`` when it last wanted the host (ms), ``w|<crawl>`` its weight
    #: (lua/step_group.lua); under the group's tag, never written without a group
    group_share_prefix = _PoliteKey("gs:")

    def group_share(self, host: str) -> str:
        """The lease shares' HASH of *host* in the crawl's group (:attr:`group_share_prefix`)."""
        return f"{self.group_share_prefix}{host}"

    fails = _PoliteKey("fails")
    robots = _PoliteKey("robots")
    robots_lock = _PoliteKey("robots_lock")

    def politeness_keys(self) -> list[str]:
        """KEYS of lua/politeness.lua (POLITENESS_CALL)."""
        return self.call_keys(POLITENESS_CALL)

    def bloom_add_keys(self, op_id: str, prev_op_id: str) -> list[str]:
        """KEYS of lua/bloom_add.lua (BLOOM_ADD_CALL): this call's and the previous call's
        reply caches, the filter's meta and slices."""
        return self.call_keys(BLOOM_ADD_CALL, op_id, prev_op_id)

    #: HASH of the crawl's bounds as its workers run them (queue_max, low_watermark).
    config = _Key("config")
    seq = _Key("seq")
    token = _Key("token")
    bloom_meta = _Key("bloom:meta")

    #: Slice N of the Bloom filter is ``bloom_prefix + str(N)``.
    bloom_prefix = _Key("bloom:")
    stats = _Key("stats")
    idle_since = _Key("idle_since")
    seeding = _Key("seeding")
    workers = _Key("workers")

    #: HASH entry id -> msgpack record of a request that failed for good (failures/).
    failed = _Key("failed")

    #: ZSET entry id -> server time (ms) of its failure: the oldest are trimmed first.
    failed_at = _Key("failed_at")

    #: HASH reason -> failed requests kept with that reason.
    failed_by = _Key("failed_by")

    #: STRING: the crawl marker, a random id written by the crawl's first frontier call.
    marker = _Key("marker")

    #: STRING: the LAYOUT_VERSION of the crawl's keys, written with the marker.
    layout = _Key("layout")

    def layout1_keys(self) -> list[str]:
        """The queue ZSET and entry-host hash of layout 1 (before LAYOUT_VERSION): only to
        recognise such a crawl (frontier/layout.py), never read or written."""
        return [self._k("queue"), self._k("ehost")]

    def retry_keys(self) -> list[str]:
        """KEYS of lua/failed_retry.lua (RETRY_CALL)."""
        return self.call_keys(RETRY_CALL)

    #: STRING ``"<spider name>\t<class path>"``: the spider the crawl belongs to.
    spider = _Key("spider")

    def worker_claim(self, worker_id: str) -> str:
        """STRING ``"<host>\\t<pid>\\t<start>"``: the last process that started with
        *worker_id* (expires by itself)."""
        return self._k("claim:" + worker_id)

    op_prefix = _Key("op:")

    def op(self, op_id: str) -> str:
        return self.op_prefix + op_id

    @property
    def pattern(self) -> str:
        """SCAN pattern matching every key of this crawl (used by purge)."""
        escaped = self.base.replace("[", "\\[").replace("]", "\\]").replace("*", "\\*")
        escaped = escaped.replace("?", "\\?")
        return escaped + ":*"

    def bloom_slice(self, n: int) -> str:
        return f"{self.bloom_prefix}{n}"

    def cookie_jar(self, session: str) -> str:
        """HASH of the cookie jar of session *session* (sessions/jar.py): its name kept when
        short and plain, else hashed (as a sticky proxy session's)."""
        return self._k("jar:" + _session_part(session))

    def site_cookie_jar(self, session: str, site: str, parts: int) -> str:
        """The cookie jar of session *session* for the hosts of *site* (a registered domain,
        or an IP address: hosts that may share a cookie share a site, RFC 6265 section 5.3
        step 5 with the public suffix list).  With *parts* > 1 it lives in the partition of
        *site* (:func:`partition_of`), so a partition whose master is down stops only the
        requests of its sites; with one partition it is :meth:`cookie_jar`, whatever
        *site*."""
        if parts <= 1:
            return self.cookie_jar(session)
        return self.partition(partition_of(site, parts), parts).cookie_jar(session)
    #: SET of the names of the session pools (sessions/pool.py)
    session_pools = _Key("spools")
    #: prefix of the session records; lua/sessions.lua appends a session id to it
    session_prefix = _Key("sess:")

    def session_pool(self, pool: str) -> str:
        """ZSET session id -> uses: the drawable sessions of *pool* (lua/sessions.lua)."""
        return self._k("spool:" + _session_part(pool))

    def session_pool_info(self, pool: str) -> str:
        """HASH of *pool*'s counters (next, created, logins, check_failed, retired:<r>)."""
        return self._k("spoolinfo:" + _session_part(pool))

    def session(self, session_id: str) -> str:
        """HASH record of session *session_id* (:func:`session_pool_part` ``-<n>``: always
        plain, so lua/sessions.lua builds the same name from :attr:`session_prefix`)."""
        return self.session_prefix + session_id

    #: prefix of the session slot ZSETs; lua/sessions.lua appends a session id to it (draw,
    #: pin and gives: the sessions are not known before the call)
    session_slots_prefix = _Key("sslots:")

    def session_slots(self, session_id: str) -> str:
        """ZSET ticket -> expiry (ms) of the requests of session *session_id* in flight
        (lua/sessions.lua ``take``/``give``)."""
        return self.session_slots_prefix + session_id

    def worker_info(self, worker_id: str) -> str:
        """HASH of one worker's heartbeat (expires by itself once the worker is gone)."""
        return self._k("worker:" + worker_id)

    mon = _Key("mon")

    def series(self, tier: str) -> str:
        """STRING ring buffer of tier *tier* (``10s``, ``1m``, ``10m``)."""
        return self._k("series:" + tier)

    hoststats = _Key("hoststats")
    hostbans = _Key("hostbans")

    def sample_keys(self) -> list[str]:
        """KEYS of lua/sample.lua (SAMPLE_CALL)."""
        return self.call_keys(SAMPLE_CALL)

    def frontier_keys(self, op_id: str, prev_op_id: str, worker_id: str = "",
                      slices: bool = True) -> list[str]:
        """KEYS of lua/frontier.lua (FRONTIER_CALL): *op_id* names this call's reply cache,
        *prev_op_id* the previous call's of the same client, *worker_id* the heartbeat hash.

        The Bloom slices are passed as keys too (``BLOOM_MAX_SLICES`` of them, last), so that
        no script ever builds a key name itself; *slices* False leaves them out, for a call
        that pushes nothing (only a push reads them; the script refuses a push without them).
        """
        keys = self.call_keys(FRONTIER_CALL, op_id, prev_op_id, worker_id)
        return keys if slices else keys[:-BLOOM_MAX_SLICES]

    def call_keys(self, names: tuple[str, ...], op_id: str = "", prev_op_id: str = "",
                  worker_id: str = "") -> list[str]:
        """The KEYS of a script declared by *names* (FRONTIER_CALL, ...), in their order."""
        special = {"op": [self.op(op_id)], "prev_op": [self.op(prev_op_id)],
                   "bloom_slices": [self.bloom_slice(n) for n in range(BLOOM_MAX_SLICES)],
                   "worker_info": [self.worker_info(worker_id)],
                   "series_10s": [self.series("10s")], "series_1m": [self.series("1m")],
                   "series_10m": [self.series("10m")]}
        keys: list[str] = []
        for name in names:
            keys.extend(special[name] if name in special else [getattr(self, name)])
        return keys


#: slots of a Redis Cluster
CLUSTER_SLOTS = 16384


def partition_of(host: str, parts: int) -> int:
    """The partition (0 .. *parts* - 1) of a host key: CRC32 of its UTF-8 bytes mod *parts*,
    the same on every machine and Python (never ``hash()``)."""
    if parts <= 1:
        return 0
    return zlib.crc32(host.encode("utf-8", "surrogatepass")) % parts


@lru_cache(maxsize=65536)
def partition_tag(crawl_id: str, p: int, parts: int) -> str:
    """The hash tag of partition *p* of *parts*: ``<crawl id>/<p>.<salt>``, the salt being the
    smallest integer that puts the tag's cluster slot in the middle half of the p-th of
    *parts* equal slot ranges (the whole range when it is narrower than 4 slots); at most
    ~2 x *parts* CRC16 computations.

    Raises:
        ValueError: *p* is not in 0 .. *parts* - 1.
    """
    from redis.crc import key_slot

    if not 0 <= p < parts:
        raise ValueError(f"partition {p} is not in 0..{parts - 1}")
    lo, hi = p * CLUSTER_SLOTS // parts, (p + 1) * CLUSTER_SLOTS // parts
    if hi - lo >= 4:
        lo, hi = lo + (hi - lo) // 4, hi - (hi - lo) // 4
    for salt in range(CLUSTER_SLOTS * 64):
        tag = f"{crawl_id}/{p}.{salt}"
        if lo <= key_slot(tag.encode()) < hi:
            return tag
    raise AssertionError("no salt found")  # CRC16 reaches every slot well before this


def session_pool_part(pool: str) -> str:
    """The part of a pool's name that its session ids start with: kept when short and plain,
    else hashed (a session id is ``"<this>-<n>"``, always plain)."""
    return _session_part(pool)


def _session_part(session: str) -> str:
    """A session key as it goes into a key name: kept when short and plain, else hashed."""
    import hashlib
    import re

    if re.fullmatch(r"[A-Za-z0-9_.:\-]{1,100}", session):
        return session
    return "h" + hashlib.blake2b(session.encode("utf-8", "surrogatepass"),
                                 digest_size=16).hexdigest()


def learned_capacity_key(prefix: str, host: str) -> str:
    """STRING ``"<capacity>|<rate>|<at ms>"`` of *host* (a politeness host key): the learned
    capacity of its adaptive controller (requests/s, the rate of its last overload), its rate
    then and when it was written (Redis's clock), kept across crawls for
    ``FLEET_ADAPTIVE_MEMORY`` seconds (politeness/memory.py)::

        fleet:{adaptive:capacity}:<host>

    Fleet-wide, not a crawl's: the next crawl or recrawl of the host starts there.  The hash
    tag holds a ':' that no crawl id or pool name has, so no crawl's key can be this one, and
    on a Redis Cluster every host's is in one slot (MGET works).
    """
    return f"{prefix}:{{adaptive:capacity}}:{host}"


@dataclass(frozen=True)
class ProxyPoolKeys:
    """Key names of one proxy pool (lua/proxies.lua lists what each holds).

    A pool is named by ``FLEET_PROXY_POOL`` (default: the crawl id) and carries its own hash
    tag ``{proxypool:<name>}``, never a crawl's, so that crawls sharing it need not share a
    slot, and lua/proxies.lua touches keys of one Redis Cluster slot only::

        fleet:{proxypool:P}:proxies   HASH   id -> proxy URL (credentials included)
        fleet:{proxypool:P}:exits     HASH   id -> "status|streak|dead_until|probe"
        fleet:{proxypool:P}:removed   HASH   id -> ms (removed by a command)
        fleet:{proxypool:P}:live      HASH   id -> requests in flight
        fleet:{proxypool:P}:tat       HASH   id -> GCRA TAT (ms) of the exit's rate cap
        fleet:{proxypool:P}:tickets   ZSET   ticket -> expiry (ms)
        fleet:{proxypool:P}:ticket    HASH   ticket -> "id|site|kind"
        fleet:{proxypool:P}:seq       STRING ticket counter
        fleet:{proxypool:P}:sites     HASH   site -> last choice (ms)
        fleet:{proxypool:P}:stats     HASH   pool-wide verdict counters
        fleet:{proxypool:P}:site:<S>  HASH   id -> per (exit, site) state
        fleet:{proxypool:P}:order:<S> ZSET   id -> LRU order of the exits for site S
        fleet:{proxypool:P}:session:<K> STRING id of the exit a sticky session is bound to
    """

    prefix: str
    pool: str

    def __post_init__(self) -> None:
        validate_crawl_id(self.pool, "FLEET_PROXY_POOL")

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{proxypool:{self.pool}}}"

    def _k(self, name: str) -> str:
        return f"{self.base}:{name}"

    proxies = _Key("proxies")
    exits = _Key("exits")
    removed = _Key("removed")
    live = _Key("live")
    tat = _Key("tat")
    tickets = _Key("tickets")
    ticket = _Key("ticket")
    seq = _Key("seq")
    sites = _Key("sites")
    stats = _Key("stats")

    def site(self, site: str) -> str:
        """Per (exit, site) state of *site* (a politeness host key)."""
        return self._k("site:" + site)

    def order(self, site: str) -> str:
        """Exits of the pool in least-recently-used order for *site*."""
        return self._k("order:" + site)

    def session(self, session: str) -> str:
        """Binding of sticky session *session* (``meta["fleet_proxy_session"]``)."""
        return self._k("session:" + _session_part(session))

    def script_keys(self) -> list[str]:
        """The fixed KEYS of lua/proxies.lua, in the order its header lists them."""
        return [self.proxies, self.exits, self.removed, self.live, self.tat, self.tickets,
                self.ticket, self.seq, self.sites, self.stats]

    @property
    def pattern(self) -> str:
        """SCAN pattern matching every key of this pool."""
        escaped = self.base.replace("[", "\\[").replace("]", "\\]").replace("*", "\\*")
        return escaped.replace("?", "\\?") + ":*"


@dataclass(frozen=True)
class StartKeyKeys:
    """Key names around a scrapy-redis spider's start key (``redis_key``, e.g.
    ``mycrawler:start_urls``), which producers fill with LPUSH, SADD or ZADD
    (lua/startkey.lua; docs/from-scrapy-redis.md)::

        <start>                      LIST/SET/ZSET  the producers' entries (their key, as is)
        {<start>}:fleet:taking       HASH    id -> "<worker>\n<entry>": entries taken by a
                                             worker and not yet confirmed in the frontier;
                                             field "#" counts the ids
        {<start>}:fleet:deadlines    ZSET    id -> server ms after which another worker takes
                                             the entry over (its worker stopped renewing)
        {<start>}:fleet:bad          LIST    entries no request could be made from

    The three keys carry the start key as their hash tag (or the start key's own tag when it
    has one), so that on a Redis Cluster they share its slot and one script moves entries
    between them atomically.
    """

    start: str

    @property
    def base(self) -> str:
        opened = self.start.find("{")
        closed = self.start.find("}", opened + 1) if opened >= 0 else -1
        if opened >= 0 and closed > opened + 1:
            return f"{self.start}:fleet"  # the start key's own hash tag holds
        return f"{{{self.start}}}:fleet"

    taking = _Key("taking")
    deadlines = _Key("deadlines")
    bad = _Key("bad")

    def call_keys(self) -> list[str]:
        """The KEYS of lua/startkey.lua (:data:`START_KEY_CALL`)."""
        return [getattr(self, name) for name in START_KEY_CALL]


@dataclass(frozen=True)
class ScrapyRedisKeys:
    """The keys a scrapy-redis crawl of spider *spider* writes with its default settings
    (scrapy_redis/defaults.py): what ``scrapy fleet import-scrapy-redis`` reads."""

    spider: str

    @property
    def requests(self) -> str:
        """ZSET (PriorityQueue; a LIST for its FIFO/LIFO queues) of pickled requests."""
        return f"{self.spider}:requests"

    @property
    def dupefilter(self) -> str:
        """SET of seen request fingerprints, 40 hex digits each."""
        return f"{self.spider}:dupefilter"

    @property
    def items(self) -> str:
        """LIST of items, JSON (RedisPipeline)."""
        return f"{self.spider}:items"
