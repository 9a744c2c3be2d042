"""Every Redis key name of a crawl is built here, and only here.

All keys of one crawl share the hash tag ``{<crawl id>}`` so that the multi-key Lua scripts can
run on Redis Cluster (every key of a script must live in one slot).  Layout, with the default
prefix ``fleet`` and crawl id ``docs``::

    fleet:{docs}:queue        ZSET  entry id -> -priority     ready requests (lowest score first,
                                                              ties in member order = FIFO)
    fleet:{docs}:data         HASH  entry id -> bytes         encoded request (codec.py)
    fleet:{docs}:leases       ZSET  entry id -> expiry (ms)   leased requests, by server time
    fleet:{docs}:lease        HASH  entry id -> "token|score|host\tworker"  current lease of
                                                              each entry ("!worker": download
                                                              over; previous format
                                                              "token|score|worker" still read)
    fleet:{docs}:expiries     HASH  entry id -> count         lease expiries of an entry so far
    fleet:{docs}:dead         HASH  entry id -> msgpack       dead letters {reason, at, data}
    fleet:{docs}:delayed      ZSET  "id|score|host" -> ready (ms)  deferred requests (back
                                                              pressure; "id|score": previous)
    fleet:{docs}:parked       LIST  msgpack [id, score, host, data]  parked requests (outside the
                                                              size), oldest first
    fleet:{docs}:hostq        HASH  host -> count             entries per host in the frontier
    fleet:{docs}:ehost        HASH  entry id -> host          previous format only: read and
                                                              emptied, never written
    fleet:{docs}:ready        ZSET  host -> time (ms)         hosts with queued entries, by the
                                                              time they may be fetched again
    fleet:{docs}:tat          HASH  host -> ms                GCRA theoretical arrival time
    fleet:{docs}:hold         HASH  host -> ms                back-off: no request before then
    fleet:{docs}:hostlive     HASH  host -> count             leased, download not over
    fleet:{docs}:hostconf     HASH  host -> "T|burst|cap"     per-host overrides
    fleet:{docs}:crawldelay   HASH  host -> ms                robots.txt Crawl-delay
    fleet:{docs}:wlive        HASH  "worker|host" -> count    leases of a worker for a host
    fleet:{docs}:fails        HASH  host -> count             consecutive failures (back-off)
    fleet:{docs}:robots       HASH  host -> msgpack           shared robots.txt {status, body, at}
    fleet:{docs}:robots_lock  HASH  host -> "worker|until"    who fetches a host's robots.txt
    fleet:{docs}:config       HASH    the workers' bounds     queue_max, low_watermark
    fleet:{docs}:seq          STRING  counter                 entry ids
    fleet:{docs}:token        STRING  counter                 fencing tokens
    fleet:{docs}:bloom:meta   HASH    Bloom filter parameters, per-slice counts, generation g
    fleet:{docs}:bloom:N      STRING  bits of Bloom slice N (N = 0 .. BLOOM_MAX_SLICES-1)
    fleet:{docs}:stats        HASH    fleet-wide counters (pushed, leased, acked, ...)
    fleet:{docs}:idle_since   STRING  server time (ms) the fleet became idle
    fleet:{docs}:seeding      HASH    who consumes the start requests: holder, until (ms),
                                      progress (start requests handed on), done
    fleet:{docs}:workers      ZSET    worker id -> last heartbeat (ms)
    fleet:{docs}:op:<op id>   STRING  cached reply of a mutating script (safe retries), short TTL

Entry ids are the 15-digit, zero-padded value of ``seq``: lexicographic order is push order.
"""

from __future__ import annotations

from dataclasses import dataclass

from scrapy_fleet.config import validate_crawl_id

#: Slices a scalable Bloom filter may grow to (slice N holds capacity * 2**N fingerprints, so
#: 12 slices hold 4095 times FLEET_DUPEFILTER_CAPACITY).
BLOOM_MAX_SLICES = 12


@dataclass(frozen=True)
class CrawlKeys:
    """Key names of one crawl (see module docstring).  ``all_static`` lists the fixed ones."""

    prefix: str
    crawl_id: str

    def __post_init__(self) -> None:
        validate_crawl_id(self.crawl_id)

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.crawl_id}}}"

    def _k(self, name: str) -> str:
        return f"{self.base}:{name}"

    @property
    def queue(self) -> str:
        return self._k("queue")

    @property
    def data(self) -> str:
        return self._k("data")

    @property
    def leases(self) -> str:
        return self._k("leases")

    @property
    def lease(self) -> str:
        return self._k("lease")

    @property
    def expiries(self) -> str:
        return self._k("expiries")

    @property
    def dead(self) -> str:
        return self._k("dead")

    @property
    def delayed(self) -> str:
        return self._k("delayed")

    @property
    def parked(self) -> str:
        return self._k("parked")

    @property
    def hostq(self) -> str:
        return self._k("hostq")

    @property
    def ehost(self) -> str:
        return self._k("ehost")

    @property
    def ready(self) -> str:
        return self._k("ready")

    @property
    def tat(self) -> str:
        return self._k("tat")

    @property
    def hold(self) -> str:
        return self._k("hold")

    @property
    def hostlive(self) -> str:
        return self._k("hostlive")

    @property
    def hostconf(self) -> str:
        return self._k("hostconf")

    @property
    def crawldelay(self) -> str:
        return self._k("crawldelay")

    @property
    def wlive(self) -> str:
        return self._k("wlive")

    @property
    def fails(self) -> str:
        return self._k("fails")

    @property
    def robots(self) -> str:
        return self._k("robots")

    @property
    def robots_lock(self) -> str:
        return self._k("robots_lock")

    @property
    def size_keys(self) -> tuple[str, str, str]:
        """The ZSETs whose sizes add up to the frontier's size, which FLEET_QUEUE_MAX bounds:
        queued, leased, deferred (lua/frontier.lua counts the same)."""
        return self.queue, self.leases, self.delayed

    def politeness_keys(self) -> list[str]:
        """KEYS of lua/politeness.lua, in the order its header lists them."""
        return [self.ready, self.tat, self.hold, self.hostlive, self.hostconf, self.crawldelay,
                self.fails, self.robots, self.robots_lock]

    def host_keys(self) -> list[str]:
        """Per-host politeness state, in the order lua/hosts.lua's callers pass it."""
        return [self.ready, self.tat, self.hold, self.hostlive, self.hostconf, self.crawldelay,
                self.wlive, self.robots]

    @property
    def config(self) -> str:
        """HASH of the crawl's bounds as its workers run them (queue_max, low_watermark)."""
        return self._k("config")

    @property
    def seq(self) -> str:
        return self._k("seq")

    @property
    def token(self) -> str:
        return self._k("token")

    @property
    def bloom_meta(self) -> str:
        return self._k("bloom:meta")

    @property
    def bloom_prefix(self) -> str:
        """Slice N of the Bloom filter is ``bloom_prefix + str(N)``."""
        return self._k("bloom:")

    @property
    def stats(self) -> str:
        return self._k("stats")

    @property
    def idle_since(self) -> str:
        return self._k("idle_since")

    @property
    def seeding(self) -> str:
        return self._k("seeding")

    @property
    def workers(self) -> str:
        return self._k("workers")

    @property
    def op_prefix(self) -> str:
        return self._k("op:")

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

    def frontier_keys(self, op_id: str, prev_op_id: str) -> list[str]:
        """KEYS of lua/frontier.lua, in the order its header lists them.

        The Bloom slices are passed as keys too (``BLOOM_MAX_SLICES`` of them), so that no
        script ever builds a key name itself.
        """
        return [self.queue, self.data, self.leases, self.lease, self.expiries, self.dead,
                self.seq, self.token, self.stats, self.idle_since, self.workers, self.op(op_id),
                self.op(prev_op_id), self.delayed, self.parked, self.hostq, self.ehost,
                *self.host_keys(), self.bloom_meta,
                *(self.bloom_slice(n) for n in range(BLOOM_MAX_SLICES))]
