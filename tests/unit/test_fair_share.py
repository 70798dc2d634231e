"""Weighted fair sharing of the GPU between users (`mas.domain.fair_share`). Pure code: no server."""

from __future__ import annotations

import pytest

from mas.domain.fair_share import Passes, take_turns


def _queue(user: str, n: int) -> list[str]:
    return [f"{user}{i}" for i in range(n)]


def _one_at_a_time(waiting: dict[str, list[str]], shares: dict[str, float], passes: Passes, turns: int) -> list[str]:
    """Places freeing one by one, as renders finish."""
    given = []
    for _ in range(turns):
        (item,) = take_turns(waiting, shares=shares, passes=passes, room=1)
        waiting[item.rstrip("0123456789")].remove(item)
        given.append(item)
    return given


def test_shares_three_to_one_give_three_videos_to_one_while_both_wait():
    waiting, passes = {"a": _queue("a", 100), "b": _queue("b", 100)}, Passes()
    given = _one_at_a_time(waiting, {"a": 3.0, "b": 1.0}, passes, 80)
    assert sum(item.startswith("a") for item in given) == 60 and sum(item.startswith("b") for item in given) == 20
    for start in range(0, 80, 4):  # never more than three of a's in a row
        assert sum(item.startswith("b") for item in given[start : start + 4]) == 1


def test_a_newcomer_waits_for_one_turn_at_most_whatever_the_other_has_queued():
    waiting, passes = {"a": _queue("a", 200)}, Passes()
    _one_at_a_time(waiting, {}, passes, 100)
    waiting["b"] = ["b0"]
    assert _one_at_a_time(waiting, {}, passes, 2)[:2].count("b0") == 1


def test_time_spent_idle_is_not_saved_up_as_credit():
    passes = Passes()
    waiting = {"a": _queue("a", 50), "b": _queue("b", 1)}
    _one_at_a_time(waiting, {}, passes, 31)  # b's one video, then a's alone for a while
    waiting["b"] = _queue("b", 10)
    given = _one_at_a_time(waiting, {}, passes, 10)
    assert sum(item.startswith("b") for item in given) == 5  # back in turns, not ten in a row


def test_several_places_at_once_are_shared_too_and_each_users_order_is_kept():
    passes = Passes()
    taken = take_turns({"a": _queue("a", 5), "b": _queue("b", 5)}, shares={}, passes=passes, room=4)
    assert taken == ["a0", "b0", "a1", "b1"]
    assert take_turns({"a": []}, shares={}, passes=passes, room=3) == []


@pytest.mark.parametrize("share", [0.0, -1.0, float("nan"), float("inf")])
def test_a_share_is_a_positive_number(share):
    with pytest.raises(ValueError, match="positive"):
        take_turns({"a": ["a0"]}, shares={"a": share}, passes=Passes(), room=1)
