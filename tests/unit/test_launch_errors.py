"""The launcher surfaces the root cause, not a peer's communication error."""

from __future__ import annotations

from workbench.train.launch import _LaunchState

PEER = (
    "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:1234. This is typically caused by a remote worker crashing."
)


def _error(rank: int, message: str, wall_time: float) -> dict:
    return {"type": "error", "rank": rank, "message": message, "wall_time": wall_time}


def test_root_cause_wins_over_an_earlier_peer_failure():
    state = _LaunchState(2, None)
    state.handle(_error(0, PEER, 10.0))
    assert state.first_error is not None and state.first_error.rank == 0  # all it knows so far
    assert not state.all_reported()
    state.handle(_error(1, "ValueError: bad batch on rank 1", 10.5))
    assert state.first_error.rank == 1
    assert state.first_error.message.startswith("ValueError")
    assert state.all_reported()


def test_earliest_of_two_real_errors_wins():
    state = _LaunchState(3, None)
    state.handle(_error(2, "KeyError: 'x'", 5.0))
    state.handle(_error(0, "ValueError: y", 4.0))
    assert state.first_error.rank == 0
    state.handle({"type": "final", "rank": 1})
    assert state.all_reported()
