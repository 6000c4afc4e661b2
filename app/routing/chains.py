"""The walk of one request through its fallback chain (`app.routing.cloud` builds the
chains, providers and circuits it walks).

`ChainCall.open()` walks a chain for one request, in order:

1. A call no entry serves at all (as is or translated) is answered 404
   `endpoint_not_served`, as a single backend answers it. Otherwise, entries ruled out
   before anything is sent are passed over: a provider without its
   key (`no_api_key`), an entry that serves the call's API neither as is nor translated
   (`unsupported_endpoint`: Anthropic for `/v1/embeddings`, a chat backend for `/rerank`),
   an open circuit (`circuit_open`), a half-open circuit whose
   one trial is out (`trial_in_flight`). If that leaves nothing, the answer is 503
   `all_entries_cooling` with `Retry-After` (when the first circuit may be tried again).
2. A local backend is acquired (woken if needed), waiting at most the chain's
   `wake_timeout_s` when entries remain after it (the start goes on for later requests)
   and what is left of the deadline otherwise. When the caller says what it accepts to
   wait (`max_wait_s`: the request's header, its key, the chain; `app.routing.patience`),
   an entry with entries after it whose learned start or wake is longer is passed over at
   once (`cold_start_budget`) while it warms, and the wait for one is at most that. A
   refusal (stopped, blocked, yielded, disabled, no VRAM, failed) or a wake cut short
   moves on. A busy backend's refusal
   (queue full: `max_waiting` held, or no slot within the wait) moves on only when the
   chain's or the client key's `fallback_on` lists `queue_full`; otherwise that 503
   `backend_queue_full` with `Retry-After` is the answer (a burst at a waking model is
   not spilled to a paid provider). An entry that
   is a replica group asks the member `app.routing.replicas` picks; one that fails
   before the first byte is passed over under its own name and another member is tried
   once (a new permit of the group's circuit, within the budget) before the walk goes on.
3. The upstream is opened with the smaller of its own first-byte timeout and what is
   left of the chain's `deadline_s`. `app.routing.policy.classify` judges what comes
   back before anything reaches the client: `serve` and `relay` end the walk, `next`
   goes on. A 200 stream whose first event is an error is judged `stream_error` (next).
4. Every outcome is reported to the entry's circuit. After the first byte the chain is
   done: a stream that breaks later ends with the in-band error (the relay's job), is
   reported to the circuit, and no other entry is asked.

Budgets: one deadline for the whole walk (`deadline_s`; the relay has no total timeout
afterwards) and at most `max_attempts` upstream requests. Local refusals and skips are
not attempts. The HTTP client never retries.

The answer carries `x-microscheduler-route` (the entry that answered) and
`x-microscheduler-fallbacks`: `0`, or the number of entries passed over and why,
`2; reasoning=local_stopped; deepseek=http_5xx`. A walk that finds no answer ends in 503
`fallback_exhausted` (504 `fallback_deadline` when the deadline cut it), whose
`error.tried` lists each entry and reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Final

from app.errors import (
    AllEntriesCooling,
    EndpointNotServed,
    FallbackDeadline,
    FallbackExhausted,
    GatewayError,
    UpstreamError,
    UpstreamTimeout,
    WakeTimeout,
)
from app.lifecycle.lease import Lease
from app.lifecycle.state import BackendState
from app.routing.circuit import ChainAvailability, Permit, available_entries
from app.routing.cloud import Chain, Cloud
from app.routing.exchange import Call, Exchange, Notice
from app.routing.local import is_json_post, open_entry, served_target
from app.routing.patience import (
    EXPECTED_WAKE_HEADER,
    accepted_wait,
    expected_wake_header,
    priced_out,
)
from app.routing.policy import (
    Budget,
    FallbackReason,
    Verdict,
    classify_error,
    classify_response,
    first_byte_timeout,
)
from app.routing.replicas import MemberAttempts, Replicas
from app.routing.routed import removed
from app.settings.endpoints import Api
from app.upstreams.anthropic.provider import AnthropicStream
from app.upstreams.http import BufferedResponse, Relayable
from app.upstreams.sse_comments import content_start
from app.upstreams.sse_errors import ERROR_DATA

R = FallbackReason
ROUTE_HEADER: Final = b"x-microscheduler-route"
FALLBACKS_HEADER: Final = b"x-microscheduler-fallbacks"
# Passed over without being asked: not fallbacks from one entry to the next.
_NOT_REACHED: Final = frozenset({R.MAX_ATTEMPTS, R.DEADLINE_UNREACHED})
# Failures before the first byte that a replica group retries on another member.
_REPLICA_RETRY: Final = frozenset(
    {
        R.OVERLOADED, R.UNAVAILABLE, R.HTTP_5XX, R.STREAM_ERROR, R.CONNECT, R.TIMEOUT,
        R.DISCONNECTED, R.UPSTREAM_ERROR, R.LOCAL_STARTING, R.LOCAL_STOPPED, R.LOCAL_BLOCKED,
        R.LOCAL_YIELDED, R.LOCAL_NO_VRAM, R.LOCAL_QUEUE_FULL, R.LOCAL_DISABLED, R.LOCAL_FAILED,
        R.LOCAL_RUNTIME, R.LOCAL_UNAVAILABLE, R.COLD_START_BUDGET,
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Passed:
    """An entry the walk passed over, and why (a verdict reason or a skip reason)."""

    entry: str
    reason: FallbackReason
    detail: str | None = None  # our own message (never a provider body or a key)
    # A local refusal: the answer itself when its reason is an opt-in trigger not opted in.
    refusal: GatewayError | None = field(default=None, compare=False)


def fallbacks_header(passed: list[Passed]) -> bytes:
    """`0`, or how many entries were passed over and why: `2; a=local_stopped; b=http_5xx`."""
    if not passed:
        return b"0"
    reasons = "; ".join(f"{p.entry}={p.reason}" for p in passed)
    return f"{len(passed)}; {reasons}".encode()


class ChainCall:
    """One request's walk through its chain (see the module docstring)."""

    def __init__(
        self, cloud: Cloud, chain: Chain, call: Call, replicas: Replicas | None = None
    ) -> None:
        self._cloud = cloud
        self._chain = chain
        self._call = call
        self._replicas = replicas
        self._passed: list[Passed] = []
        self._attempts = 0
        self._accepted: float | None = None  # the wait the caller accepts (patience)
        self._priced: list[tuple[str, float]] = []  # cold entries passed over, expected ready

    async def open(self, notice: Notice | None = None) -> Exchange:
        cloud, chain = self._cloud, self._chain
        start = cloud.clock()
        budget = Budget.start(start, chain.config.deadline_s, chain.config.max_attempts)
        apis = self._call.apis()
        if not any(cloud.serves(e, api) for e in chain.entries for api in apis):
            raise self._not_served(apis)
        excluded = cloud.excluded(chain, apis)
        key = self._call.key
        if key is not None and not key.cloud:
            # The client's key may not reach the cloud (`cloud: false`), or not today
            # (`daily_cloud_tokens` spent): its providers are passed over.
            why = R.KEY_CLOUD_BUDGET if key.budget_spent else R.KEY_NO_CLOUD
            why = R.KEY_CLOUD_BUDGET_UNKNOWN if key.budget_unknown else why
            kept_off = {e: why for e in chain.entries if e in cloud.providers}
            if kept_off:
                key.kept_off_cloud()
            excluded = {**kept_off, **excluded}
        key_triggers = frozenset(key.key.config.fallback_on) if key is not None else frozenset()
        self._accepted = accepted_wait(
            self._call.max_wait_s,
            None if key is None else key.key.config.max_wait_s,
            chain.config.max_wait_s,
        )
        plan = available_entries(chain.entries, cloud.circuits, start, excluded=excluded)
        if not plan.available:
            raise self._nothing_available(plan)
        skips = {s.entry: s.reason for s in plan.skipped}
        entries = chain.entries
        for index, entry in enumerate(entries):
            skip = skips.get(entry)
            if skip is not None:
                self._passed.append(Passed(entry, skip))
                continue
            now = cloud.clock()
            if not budget.allows_attempt(now, self._attempts):
                why = R.MAX_ATTEMPTS if now < budget.deadline else R.DEADLINE_UNREACHED
                self._passed.extend(Passed(e, why) for e in entries[index:])
                break
            permit = cloud.circuits.get(entry).acquire(now)
            if permit is None:  # the trial went to another request meanwhile
                self._passed.append(Passed(entry, R.TRIAL_IN_FLIGHT))
                continue
            last = all(e in skips for e in entries[index + 1 :])
            if entry in cloud.providers:
                outcome = await self._provider(entry, permit, budget)
            elif entry in cloud.groups:
                outcome = await self._group(entry, permit, budget, notice, last)
            else:
                outcome = await self._local(entry, permit, budget, notice, last)
            if isinstance(outcome, Exchange):
                self._count_fallbacks(outcome.backend)
                if entry in cloud.providers and self._passed:
                    cloud.fell_to_cloud(chain.key, entry, key, [p.entry for p in self._passed])
                return outcome
            if outcome.refusal is not None and not chain.policy.moves_on(
                outcome.reason, key_triggers
            ):
                # Busy, not broken: its own refusal (Retry-After) is the answer.
                self._count_fallbacks(outcome.entry)
                raise outcome.refusal
            self._passed.append(outcome)
            if outcome.reason is R.DEADLINE:
                self._passed.extend(Passed(e, R.DEADLINE_UNREACHED) for e in entries[index + 1 :])
                break
        self._count_fallbacks(None)
        raise self._exhausted()

    # -- one entry ----------------------------------------------------------------------

    async def _group(
        self, group: str, permit: Permit, budget: Budget, notice: Notice | None, last: bool
    ) -> Exchange | Passed:
        """A replica group's member, picked (`app.routing.replicas`); one that fails before
        the first byte is passed over (its own name in the header) for another, once,
        with a new permit of the group's circuit and within the chain's budget."""
        cloud = self._cloud
        members = cloud.groups[group]
        attempts = MemberAttempts(self._replicas, group, members, members[0])
        while True:
            outcome = await self._local(
                attempts.current, permit, budget, notice, last, circuit=group
            )
            if isinstance(outcome, Exchange) or outcome.reason not in _REPLICA_RETRY:
                return outcome
            now = cloud.clock()
            if not attempts.may_retry or not budget.allows_attempt(now, self._attempts):
                return outcome
            retry = attempts.retry()
            again = None if retry is None else cloud.circuits.get(group).acquire(now)
            if again is None:
                return outcome
            self._passed.append(outcome)
            permit = again

    async def _local(
        self,
        name: str,
        permit: Permit,
        budget: Budget,
        notice: Notice | None,
        last: bool,
        *,
        circuit: str | None = None,
    ) -> Exchange | Passed:
        """Backend `name`; `circuit`: the entry whose circuit it reports to (its replica
        group; default: itself)."""
        entry = name if circuit is None else circuit
        cloud = self._cloud
        if name not in cloud.backends:  # removed by a reload since the request's plane
            return self._refused(name, entry, permit, removed(name))
        backend = cloud.backends[name]
        wait = await self._wait_for(name, entry, permit, budget, last)
        if isinstance(wait, Passed):
            return wait
        lease = await self._acquire(name, entry, permit, wait, notice)
        if isinstance(lease, Passed):
            return lease
        target = served_target(self._call, backend, lease)
        if target is None:  # its server said, as it woke, that it does not serve it
            cloud.release(entry, permit)
            return Passed(name, R.UNSUPPORTED_ENDPOINT)
        sent = target[0]
        if name == self._call.route.backend or is_json_post(sent):
            body = sent.body  # `open_local` writes a JSON body (once) with the entry's model
        else:
            body = sent.provider_request().body_for(backend.config.served_model)
        own = backend.upstream.timeouts.first_byte_s
        first_byte = first_byte_timeout(budget, cloud.clock(), own)
        self._attempts += 1
        try:
            opened = await open_entry(
                backend, lease, target, cloud.upstream_errors, body=body, first_byte_s=first_byte
            )
        except UpstreamError as err:  # counted, and the lease released, by open_local
            return self._raised(entry, permit, err, first_byte < own, name)
        except BaseException:
            cloud.release(entry, permit)
            raise
        verdict = self._verdict(opened.response)
        cloud.record(entry, permit, verdict)
        if verdict.action == "next":
            opened.discard()
            return Passed(name, verdict.reason, f"HTTP {opened.response.status}")
        relayed = await opened.relayable(first_byte)
        hooks = _Hooks(cloud, entry, permit, provider=False, served=verdict.action == "serve")
        return Exchange(
            self._call.route,
            name,
            relayed,
            lease,
            headers=self._answer_headers(name) + opened.headers,
            tokens=cloud.metrics.token_counter(name),
            hooks=hooks,
        )

    async def _wait_for(
        self, name: str, entry: str, permit: Permit, budget: Budget, last: bool
    ) -> float | Passed:
        """How long to wait for backend `name` to be ready: what is left of the deadline
        (at most the chain's `wake_timeout_s` when entries remain after it), and no longer
        than the caller accepts; passed over (`cold_start_budget`) at once while it warms
        when its expected start is longer than that."""
        cloud = self._cloud
        backend = cloud.backends[name]
        remaining = budget.remaining(cloud.clock())
        wait = remaining if last else min(self._chain.config.wake_timeout_s, remaining)
        accepted = self._accepted
        if accepted is None or last:
            return wait
        ready_in = backend.ready_in_s()
        if priced_out(ready_in, accepted) and await backend.requests.warm_up():
            assert ready_in is not None
            cloud.release(entry, permit)
            self._priced.append((name, ready_in))
            why = f"expected ready in {ready_in:.1f}s, the request waits {accepted:g}s"
            return Passed(name, R.COLD_START_BUDGET, why)
        if ready_in is not None and backend.state is not BackendState.READY:
            wait = min(wait, accepted)  # priced within: but never longer than accepted
        return wait

    async def _acquire(
        self, name: str, entry: str, permit: Permit, wait: float, notice: Notice | None
    ) -> Lease | Passed:
        """A lease on backend `name` within `wait`, or passed over with the refusal's
        reason (a refusal the policy relays is raised)."""
        cloud = self._cloud
        backend = cloud.backends[name]
        on_wait = notice.for_backend(name) if notice is not None else None
        try:
            return await backend.requests.acquire(
                on_wait, max_wait_s=wait, priority=self._call.priority, share=self._call.share
            )
        except GatewayError as err:
            # The chain's impatience, not the backend's failure: its start goes on.
            impatient = isinstance(err, WakeTimeout) and wait < backend.config.max_wait_s
            return self._refused(name, entry, permit, err, impatient=impatient)
        except BaseException:
            cloud.release(entry, permit)
            raise

    async def _provider(self, name: str, permit: Permit, budget: Budget) -> Exchange | Passed:
        cloud = self._cloud
        provider = cloud.providers[name]
        target = self._call.for_target(provider.supports)
        assert target is not None  # excluded otherwise (Cloud.excluded)
        sent, answer = target
        own = provider.first_byte_s
        first_byte = first_byte_timeout(budget, cloud.clock(), own)
        self._attempts += 1
        try:
            response = await provider.open(sent.provider_request(), first_byte)
        except UpstreamError as err:
            passed = self._raised(name, permit, err, first_byte < own)
            cloud.metrics.provider_outcome(name, _outcome(passed.reason))
            return passed
        except GatewayError:  # the request cannot be put in this provider's terms: a 400
            cloud.release(name, permit)
            cloud.metrics.provider_outcome(name, "client_error")
            raise
        except BaseException:
            cloud.release(name, permit)
            raise
        verdict = self._verdict(response)
        cloud.record(name, permit, verdict)
        if verdict.action == "next":
            response.release()
            cloud.metrics.provider_outcome(name, verdict.reason)
            return Passed(name, verdict.reason, f"HTTP {response.status}")
        if verdict.action == "relay":
            cloud.metrics.provider_outcome(name, "client_error")
        if answer is not None:
            try:
                response = await answer(response, first_byte)
            except BaseException:
                response.release()
                raise
        return Exchange(
            self._call.route,
            name,
            response,
            None,
            headers=self._answer_headers(name),
            tokens=cloud.metrics.token_counter(name),
            hooks=_Hooks(cloud, name, permit, provider=True, served=verdict.action == "serve"),
            cloud=True,
            # A translated stream's usage comes from the translator (`_Hooks.finished`).
            tail_usage=not isinstance(response, AnthropicStream),
        )

    def _refused(
        self, name: str, entry: str, permit: Permit, err: GatewayError, *, impatient: bool = False
    ) -> Passed:
        """Backend `name` refused a lease: passed over with the refusal's reason, or the
        refusal raised when the policy relays it. `impatient`: a wake the chain stopped
        waiting for (`local_wake_timeout`)."""
        cloud = self._cloud
        verdict = Verdict("next", R.LOCAL_WAKE_TIMEOUT) if impatient else classify_error(err)
        if verdict.action == "relay":
            cloud.release(entry, permit)
            raise err
        cloud.record(entry, permit, verdict)
        return Passed(name, verdict.reason, err.message, refusal=err)

    def _raised(
        self, entry: str, permit: Permit, err: UpstreamError, cut: bool, name: str | None = None
    ) -> Passed:
        """A transport failure: a timeout the deadline caused is the chain's, not the entry's.
        `name`: the replica group's member that failed (passed over under its own name)."""
        cloud = self._cloud
        passed = entry if name is None else name
        if cut and isinstance(err, UpstreamTimeout) and err.kind == "first_byte_timeout":
            cloud.release(entry, permit)
            return Passed(passed, R.DEADLINE, err.message)
        verdict = classify_error(err)
        cloud.record(entry, permit, verdict)
        return Passed(passed, verdict.reason, err.message)

    def _verdict(self, response: Relayable) -> Verdict:
        if response.status == 200 and response.is_event_stream and _early_error(response):
            return Verdict("next", R.STREAM_ERROR, counts_as_failure=True)
        body = (
            response.policy_body if isinstance(response, BufferedResponse) else response.first_chunk
        )
        return classify_response(
            response.status, response.headers, body, self._chain.policy, now=time.time()
        )

    # -- answers --------------------------------------------------------------------------

    def _answer_headers(self, entry: str) -> list[tuple[bytes, bytes]]:
        headers = [
            (ROUTE_HEADER, entry.encode()),
            (FALLBACKS_HEADER, fallbacks_header(self._passed)),
        ]
        if self._priced:
            headers.append((EXPECTED_WAKE_HEADER, expected_wake_header(self._priced)))
        return headers

    def _count_fallbacks(self, answered: str | None) -> None:
        reached = [p for p in self._passed if p.reason not in _NOT_REACHED]
        targets = [p.entry for p in reached[1:]] + ([answered] if answered is not None else [])
        cloud, key = self._cloud, self._chain.key
        for passed, target in zip(reached, targets, strict=False):
            cloud.fallback(key, passed.entry, target, passed.reason)

    def _tried(self) -> list[tuple[str, str]]:
        return [(p.entry, p.reason) for p in self._passed]

    def _summary(self) -> str:
        parts = []
        for p in self._passed:
            detail = f"{p.detail} " if p.detail else ""
            parts.append(f"{p.entry}: {detail}({p.reason})")
        return "; ".join(parts)

    def _not_served(self, apis: tuple[Api, ...]) -> EndpointNotServed:
        """No entry of the chain serves the call's API, as is or translated: the same 404
        a single backend gives (a 503 would have the client retry what never works)."""
        cloud, call = self._cloud, self._call
        served = "; ".join(
            f"{e} serves {', '.join(sorted(cloud.served_by(e))) or 'nothing'}"
            for e in self._chain.entries
        )
        wanted = " or ".join(str(api) for api in apis)
        return EndpointNotServed(
            f"The model '{call.route.name}' uses the fallback chain '{self._chain.key}', "
            f"and none of its entries serves {call.path} ({wanted}): {served}. An entry "
            "lists what it serves under `endpoints:` (models.yaml for a backend, "
            "cloud_providers.yaml for a provider)."
        )

    def _nothing_available(self, plan: ChainAvailability) -> GatewayError:
        self._passed = [Passed(s.entry, s.reason) for s in plan.skipped]
        headers = {FALLBACKS_HEADER.decode(): fallbacks_header(self._passed).decode()}
        what = f"the fallback chain {self._chain.key!r} of model {self._call.route.name!r}"
        if plan.retry_after_s is None:
            return FallbackExhausted(
                f"No entry of {what} can serve {self._call.path}: {self._summary()}.",
                tried=self._tried(),
                headers=headers,
            )
        return AllEntriesCooling(
            f"Every entry of {what} is cooling down after failures; retry in "
            f"{plan.retry_after_s}s: {self._summary()}.",
            tried=self._tried(),
            retry_after_s=plan.retry_after_s,
            headers=headers,
        )

    def _exhausted(self) -> GatewayError:
        cloud, chain = self._cloud, self._chain
        headers = {FALLBACKS_HEADER.decode(): fallbacks_header(self._passed).decode()}
        if self._priced:
            headers[EXPECTED_WAKE_HEADER.decode()] = expected_wake_header(self._priced).decode()
        what = f"the fallback chain {chain.key!r} of model {self._call.route.name!r}"
        if any(p.reason in (R.DEADLINE_UNREACHED, R.DEADLINE) for p in self._passed):
            return FallbackDeadline(
                f"No entry of {what} answered within its deadline_s "
                f"({chain.config.deadline_s:g}s): {self._summary()}.",
                tried=self._tried(),
                headers=headers,
            )
        later = available_entries(
            chain.entries,
            cloud.circuits,
            cloud.clock(),
            excluded=cloud.excluded(chain, self._call.apis()),
        )
        return FallbackExhausted(
            f"No entry of {what} could answer: {self._summary()}.",
            tried=self._tried(),
            retry_after_s=later.retry_after_s,
            headers=headers,
        )


def _early_error(response: Relayable) -> bool:
    if isinstance(response, AnthropicStream):
        return response.early_error
    chunk = response.first_chunk
    # The first event, past any SSE comments (vLLM's keep-alives) and blank lines.
    start = content_start(chunk)
    return start is not None and chunk[start:].lstrip().startswith(ERROR_DATA)


def _outcome(reason: FallbackReason) -> str:
    return "timeout" if reason is R.DEADLINE else reason


class _Hooks:
    """After the first byte: a broken stream reaches the circuit; provider outcomes and
    translated usage are counted when the exchange ends."""

    __slots__ = ("_cloud", "_entry", "_failed", "_permit", "_provider", "_served")

    def __init__(
        self, cloud: Cloud, entry: str, permit: Permit, *, provider: bool, served: bool
    ) -> None:
        self._cloud = cloud
        self._entry = entry
        self._permit = permit
        self._provider = provider
        self._served = served
        self._failed = False

    def stream_failed(self, exchange: Exchange, error: UpstreamError) -> None:
        self._failed = True
        self._cloud.record_failure(self._entry, self._permit, R.STREAM_ERROR)

    def finished(self, exchange: Exchange) -> None:
        response = exchange.response
        if isinstance(response, AnthropicStream):
            if response.failed and not self._failed:
                # An error event after the first content: relayed in-band, counted here.
                self._failed = True
                self._cloud.record_failure(self._entry, self._permit, R.STREAM_ERROR)
            exchange.count(*response.usage())
        if not (self._provider and self._served):
            return
        if self._failed:
            outcome = "stream_error"
        elif exchange.completed:
            outcome = "ok"
        else:
            outcome = "cancelled"
        self._cloud.metrics.provider_outcome(self._entry, outcome)
