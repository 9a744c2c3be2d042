"""The test site's capacity rule (testsite/server.py ``Capacity``), the model every adaptive
politeness figure is measured against: a token bucket that refuses above the phase's rate,
or (latency mode) one FIFO server of that rate whose queue lengthens the answers."""

from __future__ import annotations

import pytest

from testsite.server import Behaviour, Capacity


def test_the_token_bucket_refuses_above_the_phase_rate() -> None:
    cap = Capacity(prefix="/p/", phases=[[10, 4.0], [20, 1.0]])
    # 4 tokens at the start (1 s of the rate), none more at the same instant
    assert [cap.admit(100.0) for _ in range(5)] == [True] * 4 + [False]
    assert cap.admit(100.25) and not cap.admit(100.25)  # 4/s: one token per 0.25 s
    # the second phase: 1 token per s, at most 1 held
    assert cap.admit(111.0) and not cap.admit(111.5) and cap.admit(112.0)


def test_latency_mode_holds_answers_by_the_queue_and_refuses_none() -> None:
    cap = Capacity(prefix="/p/", phases=[[10, 5.0], [20, 20.0]], latency=0.05)
    # requests spaced at the rate (0.2 s) wait for nobody: the base latency only
    assert [cap.queue_delay(t) for t in (0.0, 0.2, 0.4)] == pytest.approx([0.05] * 3)
    # four at once: each waits for the ones before it, 1/rate each
    assert [cap.queue_delay(1.0) for _ in range(4)] == pytest.approx(
        [0.05, 0.25, 0.45, 0.65])
    # the queue drains at the rate: at 1.8 s the server is free again
    assert cap.queue_delay(1.8) == pytest.approx(0.05)
    # the next phase serves 20/s: two at once, the second waits 0.05 s
    assert [cap.queue_delay(12.0) for _ in range(2)] == pytest.approx([0.05, 0.10])


def test_the_latency_field_is_read_from_the_behaviour_json() -> None:
    behaviour = Behaviour.from_dict({"capacity": [
        {"prefix": "/p/", "phases": [[1, 5]], "latency": 0.05, "host": "127.0.0.2"}]})
    assert behaviour.capacity[0].latency == 0.05
    assert Behaviour.from_dict({"capacity": [{"prefix": "/p/", "phases": [[1, 5]]}]}
                               ).capacity[0].latency is None
