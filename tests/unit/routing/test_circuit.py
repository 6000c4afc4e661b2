"""Circuit breakers: transitions on an explicit clock (plain numbers), the single trial,
cooldowns from verdicts, and which chain entries may be tried."""

from __future__ import annotations

import pytest

from app.routing.circuit import (
    ChainAvailability,
    Circuit,
    CircuitConfig,
    Circuits,
    CircuitSnapshot,
    CircuitState,
    Permit,
    Skipped,
    available_entries,
)
from app.routing.policy import FallbackReason as R
from app.routing.policy import Verdict

FAIL = Verdict("next", R.HTTP_5XX, counts_as_failure=True)
OK = Verdict("serve", R.OK, upstream_ok=True)
RELAYED = Verdict("relay", R.CLIENT_ERROR, upstream_ok=True)
NEUTRAL = Verdict("next", R.LOCAL_BLOCKED)


def rate_limited(seconds: float) -> Verdict:
    return Verdict("next", R.RATE_LIMITED, cooldown_s=seconds, counts_as_failure=True)


def permit(circuit: Circuit, now: float) -> Permit:
    got = circuit.acquire(now)
    assert got is not None
    return got


def fail(circuit: Circuit, now: float, verdict: Verdict = FAIL) -> None:
    circuit.record(permit(circuit, now), verdict, now)


def open_circuit(circuit: Circuit, now: float) -> None:
    for _ in range(circuit.config.failure_threshold):
        fail(circuit, now)
    assert circuit.state(now) is CircuitState.OPEN


def test_a_new_circuit_is_closed_and_grants_ordinary_permits() -> None:
    circuit = Circuit("deepseek")
    assert circuit.state(0.0) is CircuitState.CLOSED
    assert circuit.available(0.0)
    assert circuit.acquire(0.0) == Permit("deepseek", 0, trial=False)
    assert circuit.acquire(0.0) == Permit("deepseek", 0, trial=False)  # no limit while closed


def test_opens_after_the_threshold_of_consecutive_failures() -> None:
    circuit = Circuit("deepseek")
    fail(circuit, 100.0)
    fail(circuit, 101.0)
    assert circuit.state(101.0) is CircuitState.CLOSED
    fail(circuit, 102.0)
    assert circuit.snapshot(102.0) == CircuitSnapshot(
        entry="deepseek",
        state=CircuitState.OPEN,
        consecutive_failures=3,
        open_until=132.0,  # the 30 s default cooldown
        retry_in_s=30.0,
        last_reason=R.HTTP_5XX,
        trial_in_flight=False,
    )
    assert not circuit.available(131.0)
    assert circuit.acquire(131.0) is None
    assert circuit.state(132.0) is CircuitState.HALF_OPEN
    assert circuit.available(132.0)


def test_a_success_resets_the_count() -> None:
    circuit = Circuit("deepseek")
    fail(circuit, 1.0)
    fail(circuit, 2.0)
    circuit.record(permit(circuit, 3.0), OK, 3.0)
    assert circuit.snapshot(3.0).consecutive_failures == 0
    fail(circuit, 4.0)
    fail(circuit, 5.0)
    assert circuit.state(5.0) is CircuitState.CLOSED
    fail(circuit, 6.0)
    assert circuit.state(6.0) is CircuitState.OPEN


def test_a_relayed_client_error_counts_as_a_success() -> None:
    circuit = Circuit("deepseek")
    fail(circuit, 1.0)
    fail(circuit, 2.0)
    circuit.record(permit(circuit, 3.0), RELAYED, 3.0)
    assert circuit.snapshot(3.0).consecutive_failures == 0


def test_a_neutral_verdict_neither_counts_nor_resets() -> None:
    circuit = Circuit("reasoning")
    fail(circuit, 1.0)
    fail(circuit, 2.0)
    circuit.record(permit(circuit, 3.0), NEUTRAL, 3.0)
    assert circuit.snapshot(3.0).consecutive_failures == 2
    assert circuit.state(3.0) is CircuitState.CLOSED
    fail(circuit, 4.0)
    assert circuit.state(4.0) is CircuitState.OPEN


def test_a_cooldown_verdict_opens_at_once_for_that_long() -> None:
    circuit = Circuit("anthropic")
    fail(circuit, 100.0, rate_limited(12.0))
    snap = circuit.snapshot(100.0)
    assert snap.state is CircuitState.OPEN
    assert snap.open_until == 112.0
    assert snap.last_reason == "rate_limited"
    assert snap.consecutive_failures == 1
    assert circuit.acquire(111.0) is None
    assert circuit.acquire(112.0) == Permit("anthropic", 2, trial=True)


def test_an_auth_cooldown_outlasts_the_threshold_cooldown() -> None:
    circuit = Circuit("anthropic")
    auth = Verdict("next", R.AUTH_MISCONFIGURED, cooldown_s=300.0, counts_as_failure=True)
    fail(circuit, 0.0, auth)
    assert circuit.snapshot(0.0).open_until == 300.0


def test_a_shorter_cooldown_never_shortens_an_open_circuit() -> None:
    circuit = Circuit("anthropic")
    in_flight = permit(circuit, 0.0)
    fail(circuit, 0.0, rate_limited(60.0))
    # A request sent before the circuit opened reports a shorter Retry-After.
    circuit.record(in_flight, rate_limited(5.0), 1.0)
    assert circuit.snapshot(1.0).open_until == 60.0
    # A longer one extends it: it is the upstream's own word, even from an older request.
    late = Permit("anthropic", 0, trial=False)
    circuit.record(late, rate_limited(90.0), 2.0)
    assert circuit.snapshot(2.0).open_until == 92.0


def test_half_open_grants_exactly_one_trial() -> None:
    circuit = Circuit("deepseek")
    open_circuit(circuit, 0.0)
    assert circuit.acquire(30.0) == Permit("deepseek", 2, trial=True)
    # A second caller at the same moment, and later ones, are refused while it runs.
    assert circuit.acquire(30.0) is None
    assert circuit.acquire(100.0) is None
    assert not circuit.available(100.0)
    snap = circuit.snapshot(100.0)
    assert snap.state is CircuitState.HALF_OPEN
    assert snap.trial_in_flight


def test_a_successful_trial_closes_the_circuit() -> None:
    circuit = Circuit("deepseek")
    open_circuit(circuit, 0.0)
    trial = permit(circuit, 30.0)
    circuit.record(trial, OK, 31.0)
    assert circuit.snapshot(31.0) == CircuitSnapshot(
        entry="deepseek",
        state=CircuitState.CLOSED,
        consecutive_failures=0,
        open_until=None,
        retry_in_s=0.0,
        last_reason=R.HTTP_5XX,
        trial_in_flight=False,
    )
    assert circuit.acquire(31.0) == Permit("deepseek", 3, trial=False)
    assert circuit.acquire(31.0) == Permit("deepseek", 3, trial=False)


def test_a_failed_trial_reopens_with_a_growing_cooldown_up_to_the_cap() -> None:
    circuit = Circuit("deepseek", CircuitConfig(cooldown_s=30.0, backoff=2.0, max_cooldown_s=100.0))
    open_circuit(circuit, 0.0)
    assert circuit.snapshot(0.0).open_until == 30.0
    fail(circuit, 30.0)  # the trial fails
    assert circuit.snapshot(30.0).open_until == 90.0  # 60 s
    fail(circuit, 90.0)
    assert circuit.snapshot(90.0).open_until == 190.0  # 120 s, capped at 100
    assert circuit.snapshot(90.0).consecutive_failures == 5
    # A success starts again from the base cooldown.
    circuit.record(permit(circuit, 190.0), OK, 190.0)
    open_circuit(circuit, 200.0)
    assert circuit.snapshot(200.0).open_until == 230.0


def test_a_fixed_cooldown_with_backoff_one() -> None:
    circuit = Circuit("deepseek", CircuitConfig(cooldown_s=10.0, backoff=1.0))
    open_circuit(circuit, 0.0)
    fail(circuit, 10.0)
    fail(circuit, 20.0)
    assert circuit.snapshot(20.0).open_until == 30.0


def test_a_trial_with_a_cooldown_verdict_uses_that_cooldown() -> None:
    circuit = Circuit("anthropic")
    open_circuit(circuit, 0.0)
    fail(circuit, 30.0, rate_limited(5.0))
    assert circuit.snapshot(30.0).open_until == 35.0


def test_a_neutral_trial_is_given_back() -> None:
    circuit = Circuit("reasoning")
    open_circuit(circuit, 0.0)
    trial = permit(circuit, 30.0)
    circuit.record(trial, NEUTRAL, 31.0)
    assert circuit.state(31.0) is CircuitState.HALF_OPEN
    assert circuit.snapshot(31.0).consecutive_failures == 3
    nxt = circuit.acquire(31.0)
    assert nxt == Permit("reasoning", 4, trial=True)
    assert circuit.acquire(31.0) is None


def test_a_lost_trial_is_replaced_after_trial_timeout() -> None:
    circuit = Circuit("deepseek", CircuitConfig(trial_timeout_s=60.0))
    open_circuit(circuit, 0.0)
    lost = permit(circuit, 30.0)
    assert circuit.acquire(89.0) is None
    assert circuit.available(90.0)
    replacement = permit(circuit, 90.0)
    assert replacement.trial
    assert replacement.generation == lost.generation + 1
    # The lost trial reporting late neither closes nor reopens the circuit.
    circuit.record(lost, OK, 91.0)
    assert circuit.state(91.0) is CircuitState.HALF_OPEN
    circuit.record(lost, FAIL, 91.0)
    assert circuit.state(91.0) is CircuitState.HALF_OPEN
    assert circuit.snapshot(91.0).consecutive_failures == 3
    circuit.record(replacement, OK, 92.0)
    assert circuit.state(92.0) is CircuitState.CLOSED


def test_reports_from_before_the_circuit_opened_do_not_count() -> None:
    circuit = Circuit("deepseek")
    early = [permit(circuit, 0.0) for _ in range(5)]
    for p in early[:3]:
        circuit.record(p, FAIL, 1.0)
    assert circuit.snapshot(1.0).open_until == 31.0
    # Two more failures of requests sent while it was closed do not extend the cooldown...
    circuit.record(early[3], FAIL, 2.0)
    assert circuit.snapshot(2.0).open_until == 31.0
    assert circuit.snapshot(2.0).consecutive_failures == 3
    # ... and a late success does not close it.
    circuit.record(early[4], OK, 3.0)
    assert circuit.state(3.0) is CircuitState.OPEN
    # Once closed by a trial, an old failure still does not count.
    circuit.record(permit(circuit, 31.0), OK, 31.0)
    circuit.record(early[3], FAIL, 32.0)
    assert circuit.snapshot(32.0).consecutive_failures == 0


def test_a_failure_after_the_first_byte_counts_on_the_same_permit() -> None:
    circuit = Circuit("deepseek")
    p = permit(circuit, 0.0)
    circuit.record(p, OK, 0.0)
    circuit.record_failure(p, 5.0, R.DISCONNECTED)
    snap = circuit.snapshot(5.0)
    assert snap.consecutive_failures == 1
    assert snap.last_reason == "disconnected"


def test_threshold_one_opens_on_the_first_failure() -> None:
    circuit = Circuit("deepseek", CircuitConfig(failure_threshold=1, cooldown_s=5.0))
    fail(circuit, 0.0)
    assert circuit.snapshot(0.0).open_until == 5.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failure_threshold": 0}, "failure_threshold"),
        ({"cooldown_s": 0.0}, "cooldown_s"),
        ({"backoff": 0.5}, "backoff"),
        ({"cooldown_s": 60.0, "max_cooldown_s": 30.0}, "max_cooldown_s"),
        ({"trial_timeout_s": 0.0}, "trial_timeout_s"),
    ],
)
def test_circuit_config_is_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CircuitConfig(**kwargs)  # type: ignore[arg-type]


# -- the registry --------------------------------------------------------------------------


def test_circuits_are_per_entry_with_overrides() -> None:
    circuits = Circuits(
        CircuitConfig(cooldown_s=30.0),
        overrides={"anthropic": CircuitConfig(cooldown_s=120.0)},
        entries=["reasoning", "deepseek"],
    )
    assert circuits.get("deepseek") is circuits.get("deepseek")
    assert circuits.get("deepseek").config.cooldown_s == 30.0
    assert circuits.get("anthropic").config.cooldown_s == 120.0
    open_circuit(circuits.get("deepseek"), 10.0)
    snap = circuits.snapshot(20.0)
    assert list(snap) == ["anthropic", "deepseek", "reasoning"]
    assert snap["deepseek"] == CircuitSnapshot(
        entry="deepseek",
        state=CircuitState.OPEN,
        consecutive_failures=3,
        open_until=40.0,
        retry_in_s=20.0,
        last_reason=R.HTTP_5XX,
        trial_in_flight=False,
    )
    assert snap["reasoning"].state is CircuitState.CLOSED


# -- which entries of a chain may be tried ------------------------------------------------

CHAIN = ("reasoning", "vast", "deepseek", "anthropic")


def test_every_closed_entry_is_available_in_order() -> None:
    circuits = Circuits(entries=["reasoning"])
    assert available_entries(CHAIN, circuits, 0.0) == ChainAvailability(CHAIN, ())


def test_open_entries_are_skipped_with_their_reason() -> None:
    circuits = Circuits()
    open_circuit(circuits.get("vast"), 0.0)
    fail(circuits.get("anthropic"), 0.0, rate_limited(12.0))
    result = available_entries(CHAIN, circuits, 5.0, excluded={"deepseek": R.NO_API_KEY})
    assert result == ChainAvailability(
        available=("reasoning",),
        skipped=(
            Skipped("vast", R.CIRCUIT_OPEN, R.HTTP_5XX, 30.0),
            Skipped("deepseek", R.NO_API_KEY),
            Skipped("anthropic", R.CIRCUIT_OPEN, R.RATE_LIMITED, 12.0),
        ),
    )


def test_an_entry_past_its_cooldown_is_available_for_its_trial() -> None:
    circuits = Circuits()
    open_circuit(circuits.get("vast"), 0.0)
    result = available_entries(["vast"], circuits, 30.0)
    assert result == ChainAvailability(("vast",), ())
    assert circuits.get("vast").state(30.0) is CircuitState.HALF_OPEN  # nothing was acquired


def test_all_open_gives_the_earliest_retry_time() -> None:
    circuits = Circuits()
    open_circuit(circuits.get("reasoning"), 0.0)  # until 30
    fail(circuits.get("vast"), 0.0, rate_limited(12.5))  # until 12.5
    fail(circuits.get("deepseek"), 0.0, rate_limited(40.0))
    fail(circuits.get("anthropic"), 0.0, rate_limited(300.0))
    result = available_entries(CHAIN, circuits, 2.0)
    assert result.available == ()
    assert [s.entry for s in result.skipped] == list(CHAIN)
    assert result.retry_at == 12.5
    assert result.retry_after_s == 11  # ceil(10.5)


def test_a_trial_in_flight_may_free_its_entry_any_moment() -> None:
    circuits = Circuits()
    open_circuit(circuits.get("vast"), 0.0)
    permit(circuits.get("vast"), 30.0)
    result = available_entries(["vast"], circuits, 31.0)
    assert result == ChainAvailability(
        available=(),
        skipped=(Skipped("vast", R.TRIAL_IN_FLIGHT, R.HTTP_5XX, 31.0),),
        retry_at=31.0,
        retry_after_s=1,
    )


def test_only_excluded_entries_give_no_retry_time() -> None:
    result = available_entries(["deepseek"], Circuits(), 0.0, excluded={"deepseek": R.NO_API_KEY})
    assert result == ChainAvailability((), (Skipped("deepseek", R.NO_API_KEY),), None, None)
