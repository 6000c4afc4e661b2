"""Per-entry circuit breakers with cooldowns (issue 5, item 6). Pure: time is passed in.

Each chain entry (a local backend or a cloud provider) has one `Circuit`:

    closed     requests pass; `failure_threshold` consecutive failures open it
    open       skipped until `open_until`
    half_open  past `open_until`: exactly one trial request is let through;
               its success closes the circuit, its failure opens it again

Rules:
- A verdict with `cooldown_s` (Retry-After on 429/503/529, an auth or quota failure)
  opens the circuit at once for that long, whatever the count. Opening again never
  shortens a deadline already set (a later, shorter Retry-After keeps the longer one).
- Opened by the threshold or by a failed trial, the cooldown is
  `cooldown_s * backoff ** trips`, capped at `max_cooldown_s`, where `trips` counts the
  failed trials since the circuit was last closed: 30 s, 60 s, 120 s, ... by default. Set
  `backoff=1` for a fixed cooldown. A closed circuit starts again from `cooldown_s`.
- A success (`Verdict.upstream_ok`) resets the consecutive-failure count; a neutral
  verdict (a local refusal: stopped, blocked, queue full, ...) changes nothing and gives
  back a trial it held, so the next caller may try.
- One trial at a time: `acquire()` grants the trial to the first caller past
  `open_until` and refuses everyone else until that trial is reported. `acquire` never
  awaits, so under asyncio (one thread) two callers cannot both get it. A trial not
  reported within `trial_timeout_s` is presumed lost (a caller that died without
  reporting) and the next caller gets a new one.
- Every report carries the `Permit` it answers. Permits belong to a generation that moves
  on at every open, trial and close; a report from an older generation (a request that
  started before the circuit opened, or a lost trial) neither counts nor closes, but a
  cooldown it carries still applies: it is the upstream's own word.

Times are the caller's monotonic seconds. Report each permit once, when its verdict is
known (at the first byte). A failure after the first byte (a stream cut mid-way) may be
reported with `record_failure` on the same permit; it counts unless the circuit moved on
meanwhile (a trial's own success closed it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from math import ceil

from app.routing.policy import FallbackReason, Verdict


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class CircuitConfig:
    failure_threshold: int = 3
    cooldown_s: float = 30.0
    backoff: float = 2.0
    max_cooldown_s: float = 600.0
    trial_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if not self.cooldown_s > 0:
            raise ValueError("cooldown_s must be positive")
        if self.backoff < 1:
            raise ValueError("backoff must be at least 1")
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError("max_cooldown_s must be at least cooldown_s")
        if not self.trial_timeout_s > 0:
            raise ValueError("trial_timeout_s must be positive")


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to send one request to an entry; hand it back with the outcome."""

    entry: str
    generation: int
    trial: bool


@dataclass(frozen=True, slots=True)
class CircuitSnapshot:
    """One circuit as `/status` and the metrics show it."""

    entry: str
    state: CircuitState
    consecutive_failures: int
    open_until: float | None  # set while open (on the caller's clock)
    retry_in_s: float  # seconds until it may be tried again; 0 when it may be now
    last_reason: FallbackReason | None
    trial_in_flight: bool


class Circuit:
    """The breaker of one chain entry."""

    def __init__(self, entry: str, config: CircuitConfig | None = None) -> None:
        self.entry = entry
        self.config = config or CircuitConfig()
        self._state = CircuitState.CLOSED
        self._generation = 0
        self._failures = 0
        self._trips = 0
        self._open_until = 0.0
        self._trial_started: float | None = None
        self._last_reason: FallbackReason | None = None

    # -- reading ------------------------------------------------------------------------

    def state(self, now: float) -> CircuitState:
        if self._state is CircuitState.OPEN and now >= self._open_until:
            return CircuitState.HALF_OPEN
        return self._state

    def available(self, now: float) -> bool:
        """True if `acquire(now)` would grant a permit (it does not take one)."""
        if self._state is CircuitState.CLOSED:
            return True
        if self._state is CircuitState.OPEN:
            return now >= self._open_until
        return self._trial_lost(now)

    def available_at(self, now: float) -> float:
        """The earliest time this entry may be tried: `now` when it may be now, and while a
        trial is in flight (its success may close the circuit any moment)."""
        if self._state is CircuitState.OPEN:
            return max(now, self._open_until)
        return now

    def snapshot(self, now: float) -> CircuitSnapshot:
        is_open = self._state is CircuitState.OPEN
        return CircuitSnapshot(
            entry=self.entry,
            state=self.state(now),
            consecutive_failures=self._failures,
            open_until=self._open_until if is_open else None,
            retry_in_s=max(0.0, self._open_until - now) if is_open else 0.0,
            last_reason=self._last_reason,
            trial_in_flight=self._state is CircuitState.HALF_OPEN and not self._trial_lost(now),
        )

    # -- taking a permit ------------------------------------------------------------------

    def acquire(self, now: float) -> Permit | None:
        """A permit to send one request now, or None (open, or a trial in flight)."""
        if self._state is CircuitState.CLOSED:
            return Permit(self.entry, self._generation, trial=False)
        if not self.available(now):
            return None
        self._state = CircuitState.HALF_OPEN
        self._generation += 1
        self._trial_started = now
        return Permit(self.entry, self._generation, trial=True)

    # -- reporting ----------------------------------------------------------------------

    def record(self, permit: Permit, verdict: Verdict, now: float) -> None:
        """Report an attempt's verdict from `app.routing.policy.classify`."""
        if verdict.cooldown_s is not None or verdict.counts_as_failure:
            self.record_failure(permit, now, verdict.reason, cooldown_s=verdict.cooldown_s)
        elif verdict.upstream_ok:
            self.record_success(permit, now)
        else:
            self.release(permit, now)

    def record_success(self, permit: Permit, now: float) -> None:
        if permit.generation != self._generation:
            return
        if permit.trial:
            self._state = CircuitState.CLOSED
            self._generation += 1
            self._trips = 0
            self._trial_started = None
        self._failures = 0

    def record_failure(
        self, permit: Permit, now: float, reason: FallbackReason, *, cooldown_s: float | None = None
    ) -> None:
        current = permit.generation == self._generation
        if current:
            self._failures += 1
            if permit.trial:
                self._trips += 1
        if cooldown_s is not None:
            self._open(now, cooldown_s, reason)
            return
        if not current:
            return
        self._last_reason = reason
        if permit.trial or self._failures >= self.config.failure_threshold:
            self._open(now, self._backoff_cooldown(), reason)

    def release(self, permit: Permit, now: float) -> None:
        """A neutral outcome: nothing learnt; a trial is given back for the next caller."""
        if permit.generation != self._generation or not permit.trial:
            return
        self._state = CircuitState.OPEN
        self._open_until = now
        self._trial_started = None
        self._generation += 1

    # -- internals ----------------------------------------------------------------------

    def _open(self, now: float, cooldown_s: float, reason: FallbackReason) -> None:
        until = now + cooldown_s
        if self._state is CircuitState.OPEN:
            until = max(until, self._open_until)
        self._state = CircuitState.OPEN
        self._open_until = until
        self._trial_started = None
        self._generation += 1
        self._last_reason = reason

    def _backoff_cooldown(self) -> float:
        cfg = self.config
        return float(min(cfg.cooldown_s * cfg.backoff**self._trips, cfg.max_cooldown_s))

    def _trial_lost(self, now: float) -> bool:
        started = self._trial_started
        return started is not None and now >= started + self.config.trial_timeout_s


class Circuits:
    """The circuits of every chain entry, by entry name; created on first use."""

    def __init__(
        self,
        default: CircuitConfig | None = None,
        overrides: Mapping[str, CircuitConfig] | None = None,
        entries: Iterable[str] = (),
    ) -> None:
        self._default = default or CircuitConfig()
        self._overrides = dict(overrides or {})
        self._circuits: dict[str, Circuit] = {}
        for entry in entries:
            self.get(entry)

    def get(self, entry: str) -> Circuit:
        circuit = self._circuits.get(entry)
        if circuit is None:
            circuit = Circuit(entry, self._overrides.get(entry, self._default))
            self._circuits[entry] = circuit
        return circuit

    def peek(self, entry: str) -> Circuit | None:
        """The entry's circuit if it has one yet (an entry without one is closed)."""
        return self._circuits.get(entry)

    def snapshot(self, now: float) -> dict[str, CircuitSnapshot]:
        return {name: self._circuits[name].snapshot(now) for name in sorted(self._circuits)}


# -- which entries of a chain may be tried now -----------------------------------------


@dataclass(frozen=True, slots=True)
class Skipped:
    entry: str
    reason: FallbackReason  # circuit_open, trial_in_flight, or the caller's exclusion
    last_failure: FallbackReason | None = None  # what opened the circuit
    available_at: float | None = None  # None: not within this request (excluded)


@dataclass(frozen=True, slots=True)
class ChainAvailability:
    available: tuple[str, ...]
    skipped: tuple[Skipped, ...]
    # Only when nothing is available: the earliest time an entry may be, and the same as a
    # `Retry-After` value (whole seconds, at least 1). None if no entry will ever be
    # (all excluded).
    retry_at: float | None = None
    retry_after_s: int | None = None


def available_entries(
    chain: Sequence[str],
    circuits: Circuits,
    now: float,
    *,
    excluded: Mapping[str, FallbackReason] | None = None,
) -> ChainAvailability:
    """Which entries of `chain` may be tried now, in order, and what is skipped and why.

    `excluded` maps entries the caller rules out to a reason (`no_api_key`,
    `unsupported_endpoint`, ...). Nothing is acquired: walk `available` and `acquire()`
    each entry as it is reached (a trial may be gone by then; skip it then).
    """
    excluded = excluded or {}
    available: list[str] = []
    skipped: list[Skipped] = []
    for entry in chain:
        if entry in excluded:
            skipped.append(Skipped(entry, excluded[entry]))
            continue
        circuit = circuits.peek(entry)
        if circuit is None or circuit.available(now):
            available.append(entry)
            continue
        snap = circuit.snapshot(now)
        reason = (
            FallbackReason.TRIAL_IN_FLIGHT if snap.trial_in_flight else FallbackReason.CIRCUIT_OPEN
        )
        skipped.append(Skipped(entry, reason, snap.last_reason, circuit.available_at(now)))
    if available:
        return ChainAvailability(tuple(available), tuple(skipped))
    times = [s.available_at for s in skipped if s.available_at is not None]
    if not times:
        return ChainAvailability((), tuple(skipped))
    retry_at = min(times)
    return ChainAvailability((), tuple(skipped), retry_at, max(1, ceil(retry_at - now)))
