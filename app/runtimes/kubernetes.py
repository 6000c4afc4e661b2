"""A backend run as an existing Deployment or StatefulSet, scaled between 0 and 1 replica.

The workload and its Service are created outside the gateway (kubectl, Helm); the gateway
only reads and patches the `scale` subresource (with `scale: gateway`, the default, the
gateway must be its one owner of replicas: no HPA or KEDA on it; `scale: external` below
is the other way round). Workloads outlive the gateway and are adopted.

- start: GET `.../{deployments|statefulsets}/{name}/scale`; when `spec.replicas` is 0,
  PATCH it to 1 (`application/merge-patch+json`). Sent once: nothing retries a scale-up
  in the background, so a stop that follows (it waits for the start task to end) is the
  last write and wins.
- status: running while `spec.replicas` > 0; ready once the Service's EndpointSlices hold
  an endpoint with `conditions.ready: true` (kept current by `EndpointWatch`); while none
  is, the detail says why, from the workload's pods and their events (a `FailedScheduling`
  message, a container waiting in `ImagePullBackOff`, ...), which reaches the backend's
  start progress (`/status`, wake notices). The backend's own health check still decides
  readiness as for any runtime; the endpoint is required on top of it.
- stop: PATCH replicas to 0, then wait (up to `stop_timeout_s`) until its pods are gone.

Output (`logs`, `run_output`): the newest pod of the workload, `GET .../pods/{pod}/log`
(`tailLines`, `follow=true`; its Role needs `get` on `pods/log`). While a start waits, the
run's output is read once the pod's container has started (the log answers 400 before),
from its first lines (a new pod's log is its own).

`scale: external`: another owner (KEDA, an HPA) writes its replicas, and the gateway never
does: no PATCH at all, so its Role needs no `patch` on `deployments/scale` or
`statefulsets/scale` (get is still read). start only reads the scale and starts the
endpoint watch; the backend's start then waits (up to start_timeout_s) for the owner to
scale it up and for a ready endpoint, its requests held meanwhile, which is what
`microscheduler_requests_waiting{reason="wake"}` shows for KEDA to scale on. status at 0
replicas says `stopped_by_owner` (a ready backend goes stopped, not failed); stop does
nothing (the backend only stops taking requests; the pods are the owner's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from app.runtimes.base import RuntimeFailure, RuntimeStatus
from app.runtimes.kube_api import Call, KubeApi, KubeError
from app.runtimes.output import LineSplitter
from app.settings import KubernetesRuntimeConfig

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S: Final = 290  # the API server's own default is 30-60 min; shorter is safer
WATCH_RETRY_S: Final = 1.0  # after a failed list or watch (not a 410: that relists at once)
WHY_CACHE_S: Final = 2.0  # pods/events reads at most this often while not ready
STOP_POLL_S: Final = 1.0
RUN_TAIL: Final = 5000  # lines of a new pod's log read back for its load progress
LOG_WAIT_S: Final = 1.0  # while a start waits for its pod's container to run


class EndpointWatch:
    """The ready endpoints of one Service: list its EndpointSlices, then watch them from
    the list's resourceVersion (with bookmarks); list again after a 410 (too old)."""

    def __init__(self, api: KubeApi, namespace: str, service: str) -> None:
        self._api = api
        self._ns = namespace
        self.service = service
        self._path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        self._selector = {"labelSelector": f"kubernetes.io/service-name={service}"}
        self._slices: dict[str, int] = {}  # EndpointSlice name -> ready endpoints
        self.listed = False
        self.error: str | None = None
        self.lists = 0  # how many times it listed (a relist after a 410 counts)
        self.failures = 0  # lists or watches that failed (a 410 is no failure)
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> int:
        return sum(self._slices.values())

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = self._api.spawn(self._run(), name=f"endpointslices:{self.service}")

    async def _run(self) -> None:
        call = Call("list", "endpointslices", self._ns, group="discovery.k8s.io")
        watch_call = Call("watch", "endpointslices", self._ns, group="discovery.k8s.io")
        version: str | None = None
        fresh = False  # watching from a version a list just gave
        while True:
            try:
                if version is None:
                    version = await self._list(call)
                    fresh = True
                params = {**self._selector, "resourceVersion": version}
                params["allowWatchBookmarks"] = "true"
                async for event in self._api.watch(self._path, watch_call, params, WATCH_TIMEOUT_S):
                    version = self._apply(event) or version
                    fresh = False
                self.error = None
            except Exception as exc:  # the task must live on: every failure is retried
                if isinstance(exc, KubeError) and exc.expired:
                    logger.info("endpointslice watch expired, listing again service=%s",
                                self.service)  # fmt: skip
                    if fresh:  # even a fresh list's version is too old: do not spin
                        await asyncio.sleep(WATCH_RETRY_S)
                    version = None
                    continue
                # Not RuntimeFailure only: a malformed answer must not end the watch either.
                self.error = str(exc) if isinstance(exc, RuntimeFailure) else repr(exc)
                self.failures += 1
                self.listed = False  # what it holds may be stale until the next list
                version = None
                logger.warning("endpointslice watch failed service=%s error=%s", self.service,
                               self.error)  # fmt: skip
                await asyncio.sleep(WATCH_RETRY_S)

    async def _list(self, call: Call) -> str:
        answer = await self._api.get(self._path, call, self._selector)
        self.lists += 1
        self._slices = {
            _name(item): _ready_count(item) for item in answer.get("items") or [] if _name(item)
        }
        self.listed = True
        self.error = None
        return str(answer.get("metadata", {}).get("resourceVersion", ""))

    def _apply(self, event: dict[str, Any]) -> str | None:
        """One watch event; returns the resourceVersion it carries."""
        obj = event.get("object") or {}
        version = obj.get("metadata", {}).get("resourceVersion")
        kind = event.get("type")
        if kind in ("ADDED", "MODIFIED"):
            self._slices[_name(obj)] = _ready_count(obj)
        elif kind == "DELETED":
            self._slices.pop(_name(obj), None)
        return str(version) if version else None


def _name(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def _ready_count(endpoint_slice: dict[str, Any]) -> int:
    """Endpoints with `conditions.ready: true` (a nil ready means ready, per the
    EndpointSlice API reference; consumers should treat unknown as ready)."""
    return sum(
        1
        for endpoint in endpoint_slice.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready", True) is not False
    )


class KubernetesRuntime:
    kind = "kubernetes"
    managed = True
    stop_on_shutdown = False

    def __init__(self, backend: str, config: KubernetesRuntimeConfig, api: KubeApi) -> None:
        """`api` is shared by every kubernetes backend and closed by its owner, not here."""
        self._backend = backend
        self._config = config
        self._api = api
        self._ns = config.namespace
        self._resource = config.resource
        self._what = f"{config.resource[:-1]} {config.namespace}/{config.name}"
        self._scale_path = (
            f"/apis/apps/v1/namespaces/{config.namespace}/{config.resource}/{config.name}/scale"
        )
        self.endpoints = EndpointWatch(api, config.namespace, config.service_name)
        self._why: tuple[float, str] | None = None
        self.stop_poll_s = STOP_POLL_S

    def _scale_call(self, verb: str) -> Call:
        return Call(verb, f"{self._resource}/scale", self._ns, self._config.name, group="apps")

    async def _scale(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._api.get(self._scale_path, self._scale_call("get"))
        return answer

    async def _set_replicas(self, replicas: int) -> None:
        # The one write of the runtime; `scale: external` must never reach it.
        assert not self._external, "scale: external: the gateway never writes its replicas"
        body = {"spec": {"replicas": replicas}}
        await self._api.merge_patch(self._scale_path, body, self._scale_call("patch"))

    @property
    def _external(self) -> bool:
        return self._config.scale == "external"

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:  # the cluster places it
        self.endpoints.ensure_running()
        replicas = _replicas(await self._scale())
        if self._external:
            logger.info("kubernetes workload scaled by its owner, waiting for it backend=%s "
                        "workload=%s replicas=%d", self._backend, self._what,
                        replicas)  # fmt: skip
            return
        if replicas == 0:
            await self._set_replicas(1)
        logger.info(
            "kubernetes workload started backend=%s workload=%s scaled_from=%d",
            self._backend,
            self._what,
            replicas,
        )

    async def stop(self) -> None:
        if self._external:
            logger.info("not scaling down a workload its owner scales backend=%s workload=%s",
                        self._backend, self._what)  # fmt: skip
            return
        try:
            scale = await self._scale()
        except KubeError as exc:
            if exc.status != 404:
                raise
            logger.warning("workload to stop is gone, treating it as stopped backend=%s "
                           "workload=%s", self._backend, self._what)  # fmt: skip
            return
        selector = _selector(scale)
        deadline = time.monotonic() + self._config.stop_timeout_s
        while True:
            if _replicas(scale) != 0:
                await self._set_replicas(0)
            pods = await self._pods(selector) if selector else []
            scale = await self._scale()
            if not pods and _replicas(scale) == 0:
                break
            if time.monotonic() >= deadline:
                names = ", ".join(_name(pod) for pod in pods) or "none"
                raise RuntimeFailure(
                    f"{self._what} has {_replicas(scale)} replica(s) and pods ({names}) "
                    f"{self._config.stop_timeout_s:g}s after its scale to 0 "
                    "(runtime.stop_timeout_s; check the pods' terminationGracePeriodSeconds "
                    "and finalizers, and that no HPA or KEDA scales it)"
                )
            if _replicas(scale) != 0:
                # A scale-up that landed after ours (a cancelled start's request still in
                # flight), or another owner of its replicas: scale to 0 again at the next
                # pass (after the pause: another owner must not make this a busy loop).
                logger.warning(
                    "scaled up again while stopping backend=%s workload=%s replicas=%d",
                    self._backend,
                    self._what,
                    _replicas(scale),
                )
            await asyncio.sleep(self.stop_poll_s)
        logger.info("kubernetes workload scaled to 0 backend=%s workload=%s",
                    self._backend, self._what)  # fmt: skip

    async def status(self) -> RuntimeStatus:
        self.endpoints.ensure_running()
        scale = await self._scale()
        replicas = _replicas(scale)
        if replicas == 0:
            self._why = None
            if self._external:
                return RuntimeStatus(
                    running=False,
                    detail=f"waiting for its owner (KEDA/HPA) to scale {self._what} up: 0 replicas",
                    ready=False,
                    stopped_by_owner=True,
                )
            return RuntimeStatus(running=False, detail=f"{self._what} scaled to 0")
        svc = self.endpoints.service
        if not self.endpoints.listed:
            why = self.endpoints.error or "its EndpointSlices are not listed yet"
            return RuntimeStatus(True, detail=f"{replicas} replica(s), Service {svc}: {why}",
                                 ready=False)  # fmt: skip
        ready = self.endpoints.ready
        detail = f"{replicas} replica(s), {ready} ready endpoint(s) in Service {svc}"
        if ready > 0:
            self._why = None
            return RuntimeStatus(running=True, detail=detail, ready=True)
        return RuntimeStatus(running=True, detail=f"{detail}: {await self._not_ready(scale)}",
                             ready=False)  # fmt: skip

    async def _not_ready(self, scale: dict[str, Any]) -> str:
        """Why no endpoint is ready, from the pods and their events (cached briefly)."""
        now = time.monotonic()
        if self._why is not None and now - self._why[0] < WHY_CACHE_S:
            return self._why[1]
        try:
            why = await self._explain(_selector(scale))
        except KubeError as exc:
            why = f"cannot tell why ({exc})"
        self._why = (now, why)
        return why

    async def _explain(self, selector: str | None) -> str:
        if not selector:
            return "the scale subresource has no selector yet"
        pods = await self._pods(selector)
        if not pods:
            return f"no pod yet (the {self._resource[:-1]} controller has not created one)"
        pod = _newest(pods)
        name = _name(pod)
        status = pod.get("status") or {}
        phase = status.get("phase", "Unknown")
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
                more = f": {waiting['message']}" if waiting.get("message") else ""
                return f"pod {name} {phase}, container {container.get('name')} " \
                    f"{waiting['reason']}{more}"  # fmt: skip
        if phase == "Pending":
            event = await self._newest_event(name, "FailedScheduling")
            if event is not None:
                return f"pod {name} Pending: {event}"
            return f"pod {name} Pending (being scheduled, pulling its image or starting)"
        if phase == "Running":
            return f"pod {name} Running, not ready yet (its readinessProbe has not passed)"
        return f"pod {name} {phase}"

    async def _pods(self, selector: str) -> list[dict[str, Any]]:
        answer = await self._api.get(
            f"/api/v1/namespaces/{self._ns}/pods",
            Call("list", "pods", self._ns),
            {"labelSelector": selector},
        )
        pods: list[dict[str, Any]] = answer.get("items") or []
        return pods

    async def _newest_event(self, pod: str, reason: str) -> str | None:
        answer = await self._api.get(
            f"/api/v1/namespaces/{self._ns}/events",
            Call("list", "events", self._ns),
            {"fieldSelector": f"involvedObject.name={pod}"},
        )
        events = [e for e in answer.get("items") or [] if e.get("reason") == reason]
        if not events:
            return None
        newest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime")))
        return str(newest.get("message", reason))

    async def logs(self, *, tail: int, follow: bool) -> AsyncIterator[str]:
        scale = await self._scale()
        selector = _selector(scale)
        pods = await self._pods(selector) if selector else []
        if not pods:
            raise RuntimeFailure(f"{self._what} has no pod (0 replicas, or not created yet)")
        pod = _newest(pods)
        params = {"tailLines": str(tail)}
        containers = (pod.get("spec") or {}).get("containers") or []
        if len(containers) > 1:
            params["container"] = str(containers[0].get("name", ""))
        if follow:
            params["follow"] = "true"
        name = _name(pod)
        raw = await self._api.text_stream(
            f"/api/v1/namespaces/{self._ns}/pods/{name}/log",
            Call("get", "pods/log", self._ns, name),
            params,
            follow=follow,
        )
        return _lines(raw)

    async def run_output(self) -> AsyncIterator[str]:
        while True:
            try:
                lines = await self.logs(tail=RUN_TAIL, follow=True)
            except KubeError as exc:
                if exc.status not in (400, 404):  # 400: its container has not started yet
                    raise
            except RuntimeFailure:  # no pod yet
                pass
            else:
                break
            await asyncio.sleep(LOG_WAIT_S)
        async for line in lines:
            yield line

    def describe(self) -> str:
        owner = ", scaled by its owner" if self._external else ""
        return f"kubernetes {self._what} via {self._api.url}{owner}"


def _newest(pods: list[dict[str, Any]]) -> dict[str, Any]:
    return max(pods, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp", "")))


async def _lines(raw: AsyncIterator[bytes]) -> AsyncIterator[str]:
    splitter = LineSplitter()
    try:
        async for chunk in raw:
            for line in splitter.feed(chunk):
                yield line
        for line in splitter.flush():
            yield line
    finally:
        closer = getattr(raw, "aclose", None)
        if closer is not None:
            await closer()


def _replicas(scale: dict[str, Any]) -> int:
    value = (scale.get("spec") or {}).get("replicas", 0)
    return int(value) if isinstance(value, int) else 0


def _selector(scale: dict[str, Any]) -> str | None:
    """`status.selector` of an autoscaling/v1 Scale: the pods' label query, as a string."""
    selector = (scale.get("status") or {}).get("selector")
    return str(selector) if selector else None
