"""The KEYS of each Lua script, declared once as a tuple of names, in order: a
script's prologue binds a table ``K`` of the same names to its ``KEYS[i]`` (lua/sources.py) and
:meth:`~scrapy_fleet.keys.CrawlKeys.call_keys` builds the KEYS list from the same tuple.  No
key position is written anywhere else."""

from __future__ import annotations

#: Slices a scalable Bloom filter may grow to (slice N holds capacity * 2**N fingerprints, so
#: 12 slices hold 4095 times FLEET_DUPEFILTER_CAPACITY).
BLOOM_MAX_SLICES = 12

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

#: KEYS of lua/budget_home.lua (issue 34: the crawl's page budget at P > 1, at its home: the
#: crawl's own keys) and of lua/budget_part.lua (one partition's chunk of it), in order.
BUDGET_HOME_CALL = ("budget",)
BUDGET_PART_CALL = ("budget", "queue_count", "leases", "deferred")

#: KEYS of lua/sample.lua, in order.
SAMPLE_CALL = ("stats", "workers", "leases", "deferred", "parked", "dead", "queue_count",
               *MONITOR_CALL)

def key_width(name: str) -> int:
    """How many KEYS the declared name stands for (the Bloom slices: BLOOM_MAX_SLICES)."""
    return BLOOM_MAX_SLICES if name == "bloom_slices" else 1
