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

from dataclasses import dataclass

from scrapy_fleet.checks import validate_crawl_id
from scrapy_fleet.keys.calls import (
    BLOOM_ADD_CALL,
    BLOOM_MAX_SLICES,
    CONTROL_CALL,
    FRONTIER_CALL,
    POLITENESS_CALL,
    RETRY_CALL,
    SAMPLE_CALL,
)
from scrapy_fleet.keys.naming import HasBase, Key, session_part
from scrapy_fleet.keys.partition import partition_of, partition_tag

#: the frontier's pseudo-host of stored responses (stages/records.py, lua/hosts.lua)
STAGE_HOST = "~parse"

#: The layout of a crawl's keys (this module's docstring), stored in its ``layout`` key when
#: the crawl is created.  A crawl without that key (written before it existed: layout 1, the
#: queue ZSET and the ``ehost`` hash) or of another version is refused at start.
LAYOUT_VERSION = 3

#: TEST ONLY: the key holding the offset (ms) the test clock adds to Redis TIME in every
#: script's ``server_now_ms()`` while a test has it on (lua/test_clock.lua,
#: ``lua.sources.set_test_clock``); never read by a production script.
TEST_CLOCK_KEY = "fleet-test:clock_offset_ms"


class _PoliteKey(Key):
    """A politeness key of a crawl (a host's rate, holds, concurrency, robots.txt): under
    the crawl group's tag when the crawl is in one (:attr:`CrawlKeys.politeness_base`)."""

    __slots__ = ()

    def __get__(self, obj: HasBase, owner: type | None = None) -> str:
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
    partitions = Key("partitions")

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

    queue_index = Key("qidx")
    queue_count = Key("qn")

    #: Prefix of the queue buckets' key names (passed to the scripts as a key: every bucket
    #: shares the crawl's hash tag, so it lives in the same cluster slot).
    bucket_prefix = Key("qb:")

    def bucket(self, host: str, priority: int) -> str:
        """The queue bucket of *host*'s entries of Request.priority *priority* (lua/hosts.lua,
        bucket_name: the key is -priority + 10**15, zero-padded to 16 digits)."""
        return f"{self.bucket_prefix}{host}\t{-priority + 10**15:016d}"

    data = Key("data")

    # recrawl (issue 22): the schedule of tracked URLs (lua/step_revisit.lua)
    #: ZSET slot -> due time (ms): the schedule's slots that hold records.
    revisit_index = Key("rvi")

    #: Prefix of the schedule's slot LISTs (records ``<host>\t<score>\t<request>``).
    revisit_prefix = Key("rv:")

    def revisit_slot(self, name: str) -> str:
        """The LIST of schedule slot *name* (a member of :attr:`revisit_index`)."""
        return f"{self.revisit_prefix}{name}"

    #: STRING: tracked URLs (scheduled, or in the frontier as a revisit).
    revisit_count = Key("rvn")

    #: HASH slot -> records LPOPped from it so far (a record's absolute position in its slot
    #: is this count plus its index in the LIST); the field leaves with its slot.
    revisit_popped = Key("rvp")

    #: Prefix of the place index's HASHes (sitemap ``<lastmod>``): ``rvx:<4 hex digits of the
    #: Bloom key's first 2 bytes>``, field: the key's next 6 bytes, value: the record's place
    #: (lua/step_revisit.lua).
    revisit_place_prefix = Key("rvx:")

    def revisit_place(self, bloom_key: bytes) -> tuple[str, bytes]:
        """The place index's HASH and field of the URL of Bloom key *bloom_key* (12 bytes)."""
        return f"{self.revisit_place_prefix}{bloom_key[:2].hex()}", bloom_key[2:8]

    #: STRING "1": a push carried a sitemap ``<lastmod>``: records are indexed from then on.
    revisit_lastmod = Key("rvl")

    #: Prefix of the hosts' budget HASHes (recrawl/budget.py).
    revisit_budget_prefix = Key("rvb:")

    def revisit_budget(self, host: str) -> str:
        """HASH of *host*'s tracked pages by change-rate bucket and its price ``mu``."""
        return f"{self.revisit_budget_prefix}{host}"

    #: SET of the hosts that have a budget HASH (recrawl/budget.py adds each host it syncs;
    #: status --hosts lists the recrawl's hosts from it: recrawl/view.py).
    revisit_hosts = Key("rvh")

    #: Prefix of the bitmaps ``sf:<p>`` of the stored responses' partition (stages on a
    #: partitioned crawl): bit *n* set when a stored response of entry *n* (its id's digits)
    #: of partition *p* was queued, so that a second fetch of that entry (the first worker's
    #: lease lost) queues none (lua/push_lean.lua).
    stored_from_prefix = Key("sf:")

    def stored_from(self, p: int) -> str:
        """The bitmap of the stored responses queued here for the entries of partition *p*."""
        return f"{self.stored_from_prefix}{p}"

    # -- crawl control (issue 34: pause, resume, host block; docs/control.md) ---------------
    #: STRING ``"<gen>|<until>|<hosts>"``: the control generation, the crawl's pause (-1:
    #: running; 0: paused until resumed; else paused until that server time, ms) and how many
    #: hosts are paused; missing: no control was ever used (lua/step_control.lua)
    ctl = Key("ctl")
    #: HASH of the crawl's pause: gen, until, by, at (ms), why
    control = Key("control")
    #: HASH host -> ``"<until>|<kind>|<by>|<at>|<why>"`` (until 0: until unblocked or resumed;
    #: kind ``pause`` or ``block``)
    ctlhosts = Key("ctlhosts")
    #: HASH worker id -> the control generation it holds (its calls report it)
    ctlseen = Key("ctlseen")
    #: HASH host -> ``"T|burst|cap|rate"``: live overrides (``host set``), part by part above
    #: the ``hostconf`` of FLEET_HOST_OVERRIDES (empty parts keep it; lua/hosts.lua)
    ctlhostconf = Key("ctlhostconf")

    def control_keys(self) -> list[str]:
        """KEYS of lua/control.lua (CONTROL_CALL)."""
        return self.call_keys(CONTROL_CALL)

    leases = Key("leases")
    lease = Key("lease")
    expiries = Key("expiries")
    dead = Key("dead")
    deferred = Key("deferred")
    next_due = Key("next_due")
    workers_first = Key("workers_first")
    #: workers that took leases -> their last sign of life (ms): lua/step_recover.lua
    holders = Key("holders")
    #: "<worker id>\t<entry id>" of each lease (score 0), by holder: lua/step_recover.lua
    held = Key("held")
    #: server time (ms) from which liveness counts (set after a gap: an outage)
    alive_from = Key("alive_from")
    parked = Key("parked")
    hostq = Key("hostq")
    ready = Key("ready")
    tat = _PoliteKey("tat")
    hold = _PoliteKey("hold")
    hostlive = _PoliteKey("hostlive")
    hostconf = _PoliteKey("hostconf")
    crawldelay = _PoliteKey("crawldelay")
    #: HASH host -> "r|ls|lm|lmt|dt|dk|why|ct|cap|cc|n": the host's adaptive politeness
    #: controller (lua/adaptive.lua), fleet-wide; kept with the crawl, so a recrawl or the
    #: crawl's next run starts at the rate it learned
    adaptive = _PoliteKey("adaptive")
    wlive = Key("wlive")

    # budgets (issue 34, docs/control.md "Budgets"; lua/step_budget.lua)
    #: HASH: ``pages`` / ``seconds``, the crawl's budgets set by ``scrapy fleet budget``
    #: (above FLEET_BUDGET_PAGES / FLEET_BUDGET_SECONDS); ``charged``, pages charged at lease
    #: time; ``deadline``, ms on Redis's clock after which nothing is leased (set at the first
    #: lease of a crawl with a time budget).  At P > 1 (lua/budget_home.lua) the crawl's own
    #: hash is the page budget's home (``granted``, ``returned``, ``g|<p>``, ``b|<p>``: pages
    #: granted to and given back by partition p) and a partition's holds its chunk
    #: (``chunk``, ``back``: lua/budget_part.lua)
    budget = Key("budget")
    #: HASH ``c|<host>`` -> the host's page budget set by ``scrapy fleet budget --host``,
    #: ``s|<host>`` -> its FLEET_HOST_OVERRIDES ``budget_pages``, ``n|<host>`` -> its pages
    #: charged (one HMGET reads a host's three)
    budgeth = Key("budgeth")

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
    config = Key("config")
    seq = Key("seq")
    token = Key("token")
    bloom_meta = Key("bloom:meta")

    #: Slice N of the Bloom filter is ``bloom_prefix + str(N)``.
    bloom_prefix = Key("bloom:")
    stats = Key("stats")
    idle_since = Key("idle_since")
    seeding = Key("seeding")
    workers = Key("workers")

    #: HASH entry id -> msgpack record of a request that failed for good (failures/).
    failed = Key("failed")

    #: ZSET entry id -> server time (ms) of its failure: the oldest are trimmed first.
    failed_at = Key("failed_at")

    #: HASH reason -> failed requests kept with that reason.
    failed_by = Key("failed_by")

    #: STRING: the crawl marker, a random id written by the crawl's first frontier call.
    marker = Key("marker")

    #: STRING: the LAYOUT_VERSION of the crawl's keys, written with the marker.
    layout = Key("layout")

    def layout1_keys(self) -> list[str]:
        """The queue ZSET and entry-host hash of layout 1 (before LAYOUT_VERSION): only to
        recognise such a crawl (frontier/layout.py), never read or written."""
        return [self._k("queue"), self._k("ehost")]

    def retry_keys(self) -> list[str]:
        """KEYS of lua/failed_retry.lua (RETRY_CALL)."""
        return self.call_keys(RETRY_CALL)

    #: STRING ``"<spider name>\t<class path>"``: the spider the crawl belongs to.
    spider = Key("spider")

    def worker_claim(self, worker_id: str) -> str:
        """STRING ``"<host>\\t<pid>\\t<start>"``: the last process that started with
        *worker_id* (expires by itself)."""
        return self._k("claim:" + worker_id)

    op_prefix = Key("op:")

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
        return self._k("jar:" + session_part(session))

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
    session_pools = Key("spools")
    #: prefix of the session records; lua/sessions.lua appends a session id to it
    session_prefix = Key("sess:")

    def session_pool(self, pool: str) -> str:
        """ZSET session id -> uses: the drawable sessions of *pool* (lua/sessions.lua)."""
        return self._k("spool:" + session_part(pool))

    def session_pool_info(self, pool: str) -> str:
        """HASH of *pool*'s counters (next, created, logins, check_failed, retired:<r>)."""
        return self._k("spoolinfo:" + session_part(pool))

    def session(self, session_id: str) -> str:
        """HASH record of session *session_id* (:func:`session_pool_part` ``-<n>``: always
        plain, so lua/sessions.lua builds the same name from :attr:`session_prefix`)."""
        return self.session_prefix + session_id

    #: prefix of the session slot ZSETs; lua/sessions.lua appends a session id to it (draw,
    #: pin and gives: the sessions are not known before the call)
    session_slots_prefix = Key("sslots:")

    def session_slots(self, session_id: str) -> str:
        """ZSET ticket -> expiry (ms) of the requests of session *session_id* in flight
        (lua/sessions.lua ``take``/``give``)."""
        return self.session_slots_prefix + session_id

    def worker_info(self, worker_id: str) -> str:
        """HASH of one worker's heartbeat (expires by itself once the worker is gone)."""
        return self._k("worker:" + worker_id)

    mon = Key("mon")

    def series(self, tier: str) -> str:
        """STRING ring buffer of tier *tier* (``10s``, ``1m``, ``10m``)."""
        return self._k("series:" + tier)

    hoststats = Key("hoststats")
    hostbans = Key("hostbans")

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
