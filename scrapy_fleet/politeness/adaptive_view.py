"""The adaptive politeness controller of each host as the views show it (issue 35).

One reader for ``status --hosts`` (``frontier/admin.py``), the snapshot behind ``top``, the
dashboard and ``/metrics`` (``monitoring/snapshot.py``): :func:`policy_defaults` decodes the
fleet's per-host defaults (the crawl's ``config`` hash), :func:`adaptive_fields` a host's
controller state (``K.adaptive``, written by lua/adaptive.lua) and :func:`read_adaptive` reads
both for a bounded list of hosts in one pipelined round trip.  Nothing read here is unpickled:
the state is the controller's text ``"r|ls|lm|lmt|dt|dk|why|ct|cap|cc|n"``.
"""

from __future__ import annotations

from typing import Any

import redis

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.politeness.hosts import effective_policy

#: the fields :func:`adaptive_fields` returns, with their values for a host never adapted
NEVER_ADAPTED: dict[str, Any] = {"learned_rate": None, "ceiling": None, "adaptive_rate": None,
                                 "capacity": None, "last_decrease": None,
                                 "last_decrease_at": None, "decreases": 0, "adaptive_cap": 0}


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def policy_defaults(config: Any) -> dict[str, Any]:
    """The per-host defaults of the crawl's ``config`` hash (hosts.policy_fields: bytes ->
    bytes), with neutral values for the fields a worker has not written (or not as
    numbers): {host_key, host_interval_ms, host_interval_is_rate, host_burst,
    host_concurrency}."""
    text = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in config.items()}
    out: dict[str, Any] = {"host_key": text.get("host_key", "host")}
    for name, default in (("host_interval_ms", 0), ("host_interval_is_rate", 0),
                          ("host_burst", 1), ("host_concurrency", 0)):
        out[name] = _int(text.get(name), default)
    return out


def adaptive_fields(raw: bytes | None, interval: float) -> dict[str, Any]:
    """The adaptive controller of a host (lua/adaptive.lua's state *raw*; *interval* its
    configured interval, s): ``learned_rate`` (requests/s, None: never adapted),
    ``ceiling`` (requests/s, 1 / interval; None: no configured rate), ``adaptive_rate``
    (requests/s: the rate the lease step applies, min(learned, ceiling), the ceiling when
    never adapted; None without a ceiling), ``capacity`` (the rate of its last overload,
    None: none), ``last_decrease`` (its reason: "429", "503", "timeout", "error",
    "latency"; None), ``last_decrease_at`` (unix s, Redis's clock; None), ``decreases``,
    ``adaptive_cap`` (concurrency set by the latency rule, 0: none).  A state not written
    by the fleet reads as none."""
    fields = dict(NEVER_ADAPTED)
    if interval > 0:
        fields["ceiling"] = fields["adaptive_rate"] = round(1 / interval, 3)
    parts = raw.decode(errors="replace").split("|") if raw else []
    try:
        if len(parts) >= 11:
            learned, capacity, at = float(parts[0]), float(parts[8]), int(parts[4])
            fields.update(learned_rate=round(learned, 3),
                          capacity=round(capacity, 3) if capacity > 0 else None,
                          last_decrease=parts[6] or None,
                          last_decrease_at=at / 1000 if at > 0 else None,
                          decreases=int(parts[10]), adaptive_cap=int(parts[9]))
    except ValueError:
        return dict(fields, **{k: NEVER_ADAPTED[k] for k in NEVER_ADAPTED
                               if k not in ("ceiling", "adaptive_rate")})
    if fields["ceiling"] is not None and fields["learned_rate"] is not None:
        fields["adaptive_rate"] = min(fields["learned_rate"], fields["ceiling"])
    return fields


def host_adaptive(defaults: dict[str, Any], override: bytes | None, crawl_delay: bytes | None,
                  raw: bytes | None) -> dict[str, Any]:
    """:func:`adaptive_fields` of one host from its raw ``hostconf`` *override*, robots.txt
    *crawl_delay* (ms) and controller state, under the fleet's *defaults*
    (:func:`policy_defaults`): its ceiling is the interval the lease step applies
    (``hosts.effective_policy``)."""
    delay = _int(crawl_delay, -1) if crawl_delay is not None else -1
    interval, _, _, _ = effective_policy(
        defaults, override.decode(errors="replace") if override is not None else None,
        delay if delay >= 0 else None)
    return adaptive_fields(raw, interval)


def read_adaptive(client: redis.Redis, keys: CrawlKeys, hosts: list[str],
                  config_key: str | None = None) -> dict[str, dict[str, Any]]:
    """The controller of each of *hosts* (host key -> :func:`adaptive_fields`), read in two
    round trips (HGETALL of the config hash *config_key*, this crawl's unless given, which
    may live in another slot; then one pipeline of HMGETs of ``hostconf``, ``crawldelay`` and
    ``adaptive`` for *hosts*): its cost grows with ``len(hosts)``, never with the crawl's
    size.  No hosts: no read.

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    if not hosts:
        return {}
    k = keys
    config = client.hgetall(config_key or k.config)  # (another slot for a partition's)
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(k.hostconf, hosts)
        pipe.hmget(k.crawldelay, hosts)
        pipe.hmget(k.adaptive, hosts)
        conf, delay, state = pipe.execute()
    defaults = policy_defaults(config)
    return {h: host_adaptive(defaults, c, d, s)
            for h, c, d, s in zip(hosts, conf, delay, state, strict=True)}
