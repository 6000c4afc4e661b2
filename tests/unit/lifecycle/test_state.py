from __future__ import annotations

import itertools

import pytest

from app.lifecycle.state import TRANSITIONS, BackendState, InvalidTransition, check_transition

S = BackendState
ALLOWED = {
    (S.STOPPED, S.STARTING),
    (S.STARTING, S.READY),
    (S.STARTING, S.FAILED),
    (S.STARTING, S.STOPPING),
    (S.STARTING, S.STOPPED),  # admission refused before launch
    (S.READY, S.STOPPING),
    (S.READY, S.FAILED),
    (S.STOPPING, S.STOPPED),
    (S.STOPPING, S.FAILED),
    (S.FAILED, S.STARTING),
    (S.FAILED, S.STOPPING),
    (S.FAILED, S.STOPPED),
    (S.STOPPING, S.SLEEPING),  # drained, then POST /sleep
    (S.SLEEPING, S.STARTING),  # wake up
    (S.SLEEPING, S.STOPPING),
    (S.SLEEPING, S.FAILED),  # died while asleep
    (S.STOPPED, S.SLEEPING),  # found asleep at gateway start
    (S.STARTING, S.SLEEPING),  # a wake admission refused: still asleep
}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(S, S)))
def test_the_table_allows_exactly_the_documented_transitions(
    current: BackendState, target: BackendState
) -> None:
    if (current, target) in ALLOWED:
        assert check_transition(current, target) is target
    else:
        with pytest.raises(InvalidTransition):
            check_transition(current, target)


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(S)


def test_only_ready_is_reached_from_starting_on_success() -> None:
    # A stopped backend can never serve without going through a start.
    assert S.READY not in TRANSITIONS[S.STOPPED]
    assert S.READY not in TRANSITIONS[S.FAILED]
