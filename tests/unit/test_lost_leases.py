"""frontier/lostleases.py: the lease-lost warning names the delay after which a live worker's
leases are taken back: FLEET_WORKER_DEAD_AFTER (silent: taken for dead) and
FLEET_LEASE_TIMEOUT (expired); only the latter when there is no death delay."""

from __future__ import annotations

import logging

from scrapy_fleet.frontier.lostleases import LostLeases


def _warning(caplog, dead_after: float) -> str:
    counts: dict[str, int] = {}
    lost = LostLeases(lambda k, n: counts.__setitem__(k, counts.get(k, 0) + n), 30.0,
                      lambda: None, dead_after)
    with caplog.at_level(logging.WARNING, logger="scrapy_fleet.frontier.scheduler"):
        lost.report({"1", "2"})
    assert counts == {"fleet/frontier/lease_lost": 2}
    (record,) = caplog.records
    return record.getMessage()


def test_the_warning_names_the_death_delay_and_the_lease_timeout(caplog):
    message = _warning(caplog, 6.0)
    assert message.startswith("2 lease(s) lost (2 so far)")
    assert "FLEET_WORKER_DEAD_AFTER=6.0 s" in message
    assert "FLEET_LEASE_TIMEOUT=30.0 s" in message


def test_without_a_death_delay_only_the_lease_timeout_is_named(caplog):
    message = _warning(caplog, 0.0)
    assert "FLEET_LEASE_TIMEOUT=30.0 s" in message
    assert "FLEET_WORKER_DEAD_AFTER" not in message
