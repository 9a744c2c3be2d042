"""A request deferred because none of its links fit (lua/step_ack.lua) keeps its host in its
`deferred` member and is leased again once due, against a real redis-server."""

from __future__ import annotations

from support import link_entry as entry
from support import wait_server_past

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def test_deferred_entry_keeps_its_host_in_the_member(redis_url):
    admin = FrontierAdmin(redis_url, "dfr", params=FrontierParams(host_queue_max=1,
                                                                  defer_delay=0.05))
    admin.push([entry("http://a.test/1", host="a.test"), entry("http://b.test/1", host="b.test")])
    leased = {e.entry_id: e for e in admin.call(CallBatch(take=2), worker="w").leased}
    b_id = next(i for i, e in leased.items() if b"b.test" in e.payload)
    # b's only link is for the full host a.test: nothing can be pushed, b is deferred
    result = admin.call(CallBatch(acks=[(b_id, leased[b_id].token)],
                                  pushes=[entry("http://a.test/2", 1, host="a.test")]),
                        worker="w")
    assert result.deferred == 1
    ((member, due),) = admin.client.zrange(admin.keys.deferred, 0, -1, withscores=True)
    assert member.decode().endswith("|b.test") and member.decode().startswith(b_id + "|")
    wait_server_past(admin.client, due)  # (defer_delay: 50 ms)
    back = admin.call(CallBatch(take=5), worker="w2").leased
    assert [e.entry_id for e in back] == [b_id]
    assert admin.client.hget(admin.keys.lease, b_id).split(b"|", 2)[2] == b"b.test\tw2"
