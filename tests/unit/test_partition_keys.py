"""Partition keys, tags and the FLEET_PARTITIONS setting (issue 21, docs/partitions.md)."""

from __future__ import annotations

import zlib

import pytest
from redis.crc import key_slot

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.routing import STORED_FROM_BITS, stored_source
from scrapy_fleet.keys.calls import FRONTIER_CALL
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of, partition_tag


def test_one_partition_is_todays_keys():
    keys = CrawlKeys("fleet", "docs")
    assert keys.all_partitions(1) == [keys]
    assert keys.partition(0, 1).frontier_keys("a", "b", "w") == keys.frontier_keys("a", "b", "w")
    assert keys.queue_count == "fleet:{docs}:qn"


@pytest.mark.parametrize("parts", [2, 3, 4, 8, 12, 16, 64])
def test_partition_tags_fall_in_their_slot_range(parts):
    for p in range(parts):
        keys = CrawlKeys("fleet", "docs").partition(p, parts)
        lo, hi = p * 16384 // parts, (p + 1) * 16384 // parts
        slots = {key_slot(k.encode()) for k in keys.frontier_keys("op1", "op0", "w")}
        assert len(slots) == 1  # every key of a frontier call in one slot
        slot = slots.pop()
        width = hi - lo
        assert lo + width // 4 <= slot < hi - width // 4  # the middle half of its range
        assert keys.base == f"fleet:{{{partition_tag('docs', p, parts)}}}"
        assert keys.base.startswith(f"fleet:{{docs/{p}.")


def test_partitions_of_three_masters_split_evenly():
    """redis-cli --cluster create gives 3 masters 5461/5462/5461 slots: P = 12 puts 4
    partitions on each."""
    ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
    tags = [partition_tag("docs", p, 12) for p in range(12)]
    per_master = [sum(lo <= key_slot(t.encode()) <= hi for t in tags) for lo, hi in ranges]
    assert per_master == [4, 4, 4]


def test_partition_of_a_host_is_crc32_mod_p():
    assert partition_of("example.com", 1) == 0
    assert partition_of("example.com", 8) == zlib.crc32(b"example.com") % 8
    assert partition_of("", 8) == 0
    assert {partition_of(f"h{i}.test", 4) for i in range(100)} == {0, 1, 2, 3}


def test_crawl_ids_cannot_collide_with_partition_tags():
    with pytest.raises(FleetConfigError):
        CrawlKeys("fleet", "docs/1.3")


def test_control_key_of_partitions():
    keys = CrawlKeys("fleet", "docs")
    assert keys.partitions == "fleet:{docs}:partitions"
    assert "partitions" not in FRONTIER_CALL


@pytest.mark.parametrize("value", [0, -1, 1025, "x", 1.5, True])
def test_bad_partitions_refused_naming_the_setting(value):
    with pytest.raises(FleetConfigError, match="FLEET_PARTITIONS"):
        FleetConfig.from_settings({"FLEET_PARTITIONS": value})


def test_partitions_value_read():
    assert FleetConfig.from_settings({}).partitions == 1
    assert FleetConfig.from_settings({"FLEET_PARTITIONS": "8"}).partitions == 8


def test_ip_host_key_cannot_be_partitioned():
    with pytest.raises(FleetConfigError, match="FLEET_HOST_KEY='ip'"):
        FleetConfig.from_settings({"FLEET_PARTITIONS": 4, "FLEET_HOST_KEY": "ip"})
    assert FleetConfig.from_settings({"FLEET_PARTITIONS": 4,
                                      "FLEET_HOST_KEY": "domain"}).partitions == 4
    assert FleetConfig.from_settings({"FLEET_PARTITIONS": 1,
                                      "FLEET_HOST_KEY": "ip"}).partitions == 1


class HostlessFingerprinter:
    def fingerprint(self, request):  # pragma: no cover - never called
        return b"x" * 20


def test_custom_fingerprinter_cannot_be_partitioned():
    settings = {"FLEET_PARTITIONS": 2,
                "REQUEST_FINGERPRINTER_CLASS": f"{__name__}.HostlessFingerprinter"}
    with pytest.raises(FleetConfigError, match="REQUEST_FINGERPRINTER_CLASS"):
        FleetConfig.from_settings(settings)
    ok = {"FLEET_PARTITIONS": 2,
          "REQUEST_FINGERPRINTER_CLASS": "scrapy.utils.request.RequestFingerprinter"}
    assert FleetConfig.from_settings(ok).partitions == 2
    assert FleetConfig.from_settings({**settings, "FLEET_PARTITIONS": 1}).partitions == 1


def test_a_stored_response_names_its_pages_partition_and_entry_number():
    """(lua/push_lean.lua queues one stored response per entry: bit n of sf:<p>.)"""
    assert stored_source("3:000000000000042") == (3, 42)
    assert stored_source("1:r000000000000007") == (1, 7)  # a revisit, a retried failure
    assert stored_source("0:!000000000000009") == (0, 9)
    assert stored_source(f"2:{STORED_FROM_BITS - 1:015d}") == (2, STORED_FROM_BITS - 1)
    assert stored_source(f"2:{STORED_FROM_BITS:015d}") == ()  # past a bitmap's offsets
    assert stored_source("2:abc") == () and stored_source("2:") == ()
    keys = CrawlKeys("fleet", "docs").partition(1, 4)
    assert keys.stored_from(3) == keys.base + ":sf:3"
