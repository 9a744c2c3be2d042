"""Both worker frontier clients satisfy the one interface the pump and the scheduler use
(frontier/port.py WorkerFrontier), and the pump reaches them only through it (issue 33 item 1):
no probing of the client with getattr, no member kept on the one-partition client only for
the partitioned one's sake."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from scrapy_fleet.frontier import port
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys

URL = "redis://127.0.0.1:1/0"  # (never reached: nothing here connects)
PACKAGE = Path(port.__file__).resolve().parent


def _members(proto: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(proto)
            if not name.startswith("_")} - {name for name, _ in inspect.getmembers(object)}


def _clients() -> list[object]:
    """One client of each kind, not connected (nothing is sent before ``connect``)."""
    keys, params = CrawlKeys("fleet", "port"), FrontierParams()
    return [AsyncFrontier(URL, keys, "w", params),
            PartitionedFrontier(URL, keys, "w", params, 3)]


def test_both_clients_have_every_member_of_the_port_with_its_signature():
    for client in _clients():
        for name in _members(port.WorkerFrontier):
            ours = getattr(port.WorkerFrontier, name)
            assert hasattr(client, name), (client, name)
            if callable(ours) and not isinstance(ours, property):
                theirs = getattr(type(client), name)
                assert inspect.signature(theirs) == inspect.signature(ours), (client, name)
    one, parted = _clients()
    # the partitioned client keeps work between calls (its buffer), the one-partition one none
    assert one.buffer is None and parted.buffer is parted
    assert _members(port.FrontierBuffer) <= set(dir(parted))
    assert not _members(port.FrontierBuffer) & set(dir(one))


def test_the_pump_and_the_scheduler_do_not_probe_the_client():
    for module in ("pump.py", "scheduler.py"):
        source = (PACKAGE / module).read_text()
        tree = ast.parse(source)
        probes = [node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr")
                  and ast.unparse(node.args[0]).endswith("frontier")]
        assert probes == [], (module, probes)
        assert "PartitionedFrontier(  # type: ignore" not in source
