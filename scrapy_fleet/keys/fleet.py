"""Keys that are not one crawl's: a host's learned capacity (fleet-wide), a proxy pool's,
a scrapy-redis start key's and a scrapy-redis crawl's (what ``import-scrapy-redis`` reads)."""

from __future__ import annotations

from dataclasses import dataclass

from scrapy_fleet.checks import validate_crawl_id
from scrapy_fleet.keys.calls import START_KEY_CALL
from scrapy_fleet.keys.naming import Key, session_part


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

    proxies = Key("proxies")
    exits = Key("exits")
    removed = Key("removed")
    live = Key("live")
    tat = Key("tat")
    tickets = Key("tickets")
    ticket = Key("ticket")
    seq = Key("seq")
    sites = Key("sites")
    stats = Key("stats")

    def site(self, site: str) -> str:
        """Per (exit, site) state of *site* (a politeness host key)."""
        return self._k("site:" + site)

    def order(self, site: str) -> str:
        """Exits of the pool in least-recently-used order for *site*."""
        return self._k("order:" + site)

    def session(self, session: str) -> str:
        """Binding of sticky session *session* (``meta["fleet_proxy_session"]``)."""
        return self._k("session:" + session_part(session))

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

    taking = Key("taking")
    deadlines = Key("deadlines")
    bad = Key("bad")

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
