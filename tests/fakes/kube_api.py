"""A stand-in Kubernetes API server (aiohttp, in the test's event loop) for the runtime.

It serves what the kubernetes runtime uses, shaped as the real API server answers, with a
note on where each behaviour comes from (written from the references, not from our client):

- `GET|PATCH /apis/apps/v1/namespaces/{ns}/{deployments|statefulsets}/{name}/scale`: an
  `autoscaling/v1` `Scale` (`spec.replicas`, `status.replicas`, `status.selector` as a
  label query string). Kubernetes API reference, "Scale [autoscaling/v1]".
- PATCH takes `application/merge-patch+json` only here; any other content type gets 415
  `UnsupportedMediaType` as the real server answers an unknown one (kubernetes
  `k8s.io/apiserver/pkg/endpoints/handlers/negotiation/errors.go`, errUnsupportedMediaType:
  "the body of the request was in an unknown format - accepted media types include: ..."
  with the accepted types joined by ", "; checked against that source in the code index).
  The real server also takes json-patch, strategic-merge and apply patches for built-in
  kinds; the stand-in refuses them too (a simplification: our client never sends them).
- resourceVersions are numbers inside the stand-in only; clients must treat them as
  opaque strings (kubernetes.io "API Concepts", "Resource versions").
- `GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=
  kubernetes.io/service-name={svc}`: an `EndpointSliceList` with
  `metadata.resourceVersion`; with `watch=1`, newline-delimited watch events
  `{"type":"ADDED|MODIFIED|DELETED|BOOKMARK|ERROR","object":{...}}` after that version,
  BOOKMARKs (only `metadata.resourceVersion`) when `allowWatchBookmarks=true`, the stream
  closed after `timeoutSeconds`. A version older than the retained history gets HTTP 200
  then an `ERROR` event whose object is a `Status` with code 410, reason `Expired`,
  message "too old resource version: X (Y)" (kubernetes.io "API Concepts", "Efficient
  detection of changes" and "Watch bookmarks"; apiserver watch cache `cacher`).
- `GET /api/v1/namespaces/{ns}/pods?labelSelector=a=b` (equality selectors only) and
  `GET /api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name=POD`.
- `GET /api/v1/namespaces/{ns}/pods/{name}/log?tailLines=N[&follow=true]`: the
  container's output as `text/plain` (the core/v1 "read log of the specified Pod"
  operation, `PodLogOptions`: `tailLines`, `follow`), chunked while following, which ends
  when the pod goes; a pod whose container has not started is 400 `BadRequest`
  `container "vllm" in pod "X" is waiting to start: ContainerCreating` (the kubelet's
  wording); RBAC on `pods/log` verb `get`.
- Errors are `Status` objects (`apimachinery/pkg/api/errors/errors.go`): 401
  `Unauthorized` without a known bearer token; 403 `Forbidden` with the message
  `deployments.apps "x" is forbidden: User "system:serviceaccount:NS:SA" cannot patch
  resource "deployments/scale" in API group "apps" in the namespace "NS"` for a verb the
  RBAC table denies; 404 `NotFound` `deployments.apps "x" not found`.

Test controls (plain methods, same event loop): `unschedulable(message)` (new pods stay
Pending with a `FailedScheduling` event), `container_waiting(reason, message)`,
`start_containers()` (Running, not Ready: an endpoint only once `make_ready()`),
`ready_after_s` (None: only `make_ready()`), `deny(verb, resource)`, `tokens`,
`write_log(text)` (appends to the newest pod's log, followers get it at once),
`expire_watches()` (drops the history and closes open watches, so the next watch from an
old version gets the 410), and `calls` (method, path, content type) to assert on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.fakes.servers import serve_app

SA_USER = "system:serviceaccount:llm:microscheduler"
_PATCH_TYPES = (
    "application/json-patch+json, application/merge-patch+json, "
    "application/apply-patch+yaml, application/strategic-merge-patch+json"
)
_GROUPS = {"deployments": "apps", "statefulsets": "apps", "endpointslices": "discovery.k8s.io"}


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def _error(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> web.Response:
    return web.json_response(status(code, reason, message, details), status=code)


@dataclass
class Workload:
    resource: str  # deployments | statefulsets
    name: str
    labels: dict[str, str]
    service: str
    replicas: int = 0

    @property
    def selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())


@dataclass
class FakeKube:
    namespace: str = "llm"
    tokens: set[str] = field(default_factory=lambda: {"token-1"})
    ready_after_s: float | None = 0.2
    url: str = ""
    workloads: dict[tuple[str, str], Workload] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    watches: int = 0  # watches that began streaming events (not those answered 410)
    denied: set[tuple[str, str]] = field(default_factory=set)
    rv: int = 100
    _history: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _oldest: int = 0  # watches from a version below this get 410
    _unschedulable: str | None = None
    _waiting: tuple[str, str] | None = None
    _expired: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)
    _pod_seq: int = 0
    logs: dict[str, str] = field(default_factory=dict)  # pod -> its container's output
    _log_changed: asyncio.Event = field(default_factory=asyncio.Event)

    # -- controls ---------------------------------------------------------------------------

    def add_workload(self, resource: str, name: str, *, service: str | None = None) -> Workload:
        svc = service or name
        workload = Workload(resource, name, {"app": name}, svc)
        self.workloads[resource, name] = workload
        self._slice_event(
            "ADDED",
            {
                "kind": "EndpointSlice",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {
                    "name": f"{svc}-x7k2p",
                    "namespace": self.namespace,
                    "labels": {"kubernetes.io/service-name": svc},
                },
                "addressType": "IPv4",
                "endpoints": [],
                "ports": [{"name": "http", "port": 8000}],
            },
        )
        return workload

    def deny(self, verb: str, resource: str) -> None:
        self.denied.add((verb, resource))

    def unschedulable(self, message: str) -> None:
        self._unschedulable = message

    def container_waiting(self, reason: str, message: str) -> None:
        self._waiting = (reason, message)

    def start_containers(self) -> None:
        """The pods' containers run (their logs can be read) but are not ready yet."""
        for pod in self.pods.values():
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "vllm", "ready": False,
                                       "state": {"running": {}}}],
            }  # fmt: skip
        self._sync_endpoints()

    def make_ready(self) -> None:
        for pod in self.pods.values():
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        self._sync_endpoints()

    def write_log(self, text: str) -> None:
        """The newest pod's container writes `text`."""
        newest = max(self.pods, key=lambda name: self.pods[name]["metadata"]["name"])
        self.logs[newest] = self.logs.get(newest, "") + text
        self._wake_logs()

    def _wake_logs(self) -> None:
        self._log_changed.set()
        self._log_changed = asyncio.Event()

    def expire_watches(self) -> None:
        """Compact the history (every version seen so far is now too old) and end the open
        watches, as an API server restart or a compaction would."""
        # The store moved on meanwhile (other objects changed) and was compacted up to its
        # current version: watches from any version seen so far get 410, while a fresh
        # LIST's version is watchable again (etcd keeps the compaction revision itself).
        self._next_rv()
        self._history.clear()
        self._oldest = self.rv
        self._expired.set()
        self._expired = asyncio.Event()

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()

    # -- the world --------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _slice_event(self, kind: str, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self.slices[obj["metadata"]["name"]] = obj
        self._history.append((self.rv, {"type": kind, "object": json.loads(json.dumps(obj))}))
        self._changed.set()
        self._changed = asyncio.Event()

    def _sync_endpoints(self) -> None:
        for workload in self.workloads.values():
            pods = [p for p in self.pods.values() if p["metadata"]["labels"] == workload.labels]
            endpoints = [
                {
                    "addresses": [f"10.0.0.{i + 10}"],
                    "conditions": {
                        # The pod's Ready condition (its readinessProbe), as the
                        # EndpointSlice controller sets it.
                        "ready": any(
                            c.get("type") == "Ready" and c.get("status") == "True"
                            for c in p["status"].get("conditions") or []
                        ),
                        "serving": True,
                        "terminating": False,
                    },
                    "targetRef": {"kind": "Pod", "name": p["metadata"]["name"]},
                }
                for i, p in enumerate(pods)
            ]
            for obj in list(self.slices.values()):
                svc = obj["metadata"]["labels"]["kubernetes.io/service-name"]
                if svc == workload.service and obj["endpoints"] != endpoints:
                    obj = {**obj, "endpoints": endpoints, "metadata": dict(obj["metadata"])}
                    self._slice_event("MODIFIED", obj)

    def _scale_to(self, workload: Workload, replicas: int) -> None:
        workload.replicas = replicas
        mine = [n for n, p in self.pods.items() if p["metadata"]["labels"] == workload.labels]
        if replicas == 0:
            for name in mine:
                del self.pods[name]
            self._wake_logs()
        elif not mine:
            self._pod_seq += 1
            name = f"{workload.name}-7d9f8-{self._pod_seq:05d}"
            pod_status: dict[str, Any] = {"phase": "Pending"}
            if self._unschedulable is not None:
                pod_status["conditions"] = [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                ]
                self.events.append(
                    {
                        "metadata": {"name": f"{name}.1"},
                        "reason": "FailedScheduling",
                        "type": "Warning",
                        "message": self._unschedulable,
                        "involvedObject": {"kind": "Pod", "name": name},
                        "lastTimestamp": "2026-11-25T22:00:00Z",
                    }
                )
            elif self._waiting is not None:
                reason, message = self._waiting
                pod_status["containerStatuses"] = [
                    {
                        "name": "vllm",
                        "ready": False,
                        "state": {"waiting": {"reason": reason, "message": message}},
                    }
                ]
            self.pods[name] = {
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": dict(workload.labels),
                    "creationTimestamp": "2026-11-25T22:00:00Z",
                },
                "status": pod_status,
            }
            if self.ready_after_s is not None and self._unschedulable is None and not self._waiting:
                loop = asyncio.get_running_loop()
                self._timers.append(loop.call_later(self.ready_after_s, self.make_ready))
        self._sync_endpoints()

    # -- HTTP -------------------------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.calls.append((request.method, request.path, request.content_type))
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.tokens:
            return _error(401, "Unauthorized", "Unauthorized")
        response: web.StreamResponse = await handler(request)
        return response

    def _forbidden(self, verb: str, resource: str, name: str | None) -> web.Response | None:
        if (verb, resource) not in self.denied:
            return None
        base = resource.split("/")[0]
        group = _GROUPS.get(base, "")
        qualified = f"{base}.{group}" if group else base
        subject = f'{qualified} "{name}"' if name else qualified
        message = (
            f'{subject} is forbidden: User "{SA_USER}" cannot {verb} resource '
            f'"{resource}" in API group "{group}" in the namespace "{self.namespace}"'
        )
        return _error(403, "Forbidden", message, {"name": name or "", "group": group, "kind": base})

    async def scale(self, request: web.Request) -> web.Response:
        resource, name = request.match_info["resource"], request.match_info["name"]
        verb = "get" if request.method == "GET" else "patch"
        denied = self._forbidden(verb, f"{resource}/scale", name)
        if denied is not None:
            return denied
        workload = self.workloads.get((resource, name))
        if workload is None or request.match_info["ns"] != self.namespace:
            return _error(
                404,
                "NotFound",
                f'{resource}.apps "{name}" not found',
                {"name": name, "group": "apps", "kind": resource},
            )
        if request.method == "PATCH":
            if request.content_type != "application/merge-patch+json":
                return _error(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an "
                    f"unknown format - accepted media types include: {_PATCH_TYPES}",
                )
            patch = await request.json()
            replicas = (patch.get("spec") or {}).get("replicas")
            if isinstance(replicas, int):
                self._scale_to(workload, replicas)
        return web.json_response(
            {
                "kind": "Scale",
                "apiVersion": "autoscaling/v1",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "resourceVersion": str(self.rv),
                },
                "spec": {"replicas": workload.replicas},
                "status": {"replicas": workload.replicas, "selector": workload.selector},
            }
        )

    async def pods_list(self, request: web.Request) -> web.Response:
        denied = self._forbidden("list", "pods", None)
        if denied is not None:
            return denied
        wanted = dict(
            p.split("=", 1) for p in request.query.get("labelSelector", "").split(",") if p
        )
        items = [
            p
            for p in self.pods.values()
            if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]
        return web.json_response(
            {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def events_list(self, request: web.Request) -> web.Response:
        denied = self._forbidden("list", "events", None)
        if denied is not None:
            return denied
        field_sel = request.query.get("fieldSelector", "")
        name = field_sel.removeprefix("involvedObject.name=")
        items = [e for e in self.events if not field_sel or e["involvedObject"]["name"] == name]
        return web.json_response(
            {
                "kind": "EventList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    async def endpointslices(self, request: web.Request) -> web.StreamResponse:
        watching = request.query.get("watch") in ("1", "true")
        denied = self._forbidden("watch" if watching else "list", "endpointslices", None)
        if denied is not None:
            return denied
        svc = request.query.get("labelSelector", "").removeprefix("kubernetes.io/service-name=")

        def mine(obj: dict[str, Any]) -> bool:
            return bool(obj["metadata"]["labels"]["kubernetes.io/service-name"] == svc)

        if not watching:
            items = [s for s in self.slices.values() if mine(s)]
            return web.json_response(
                {
                    "kind": "EndpointSliceList",
                    "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            )
        return await self._watch(request, mine)

    async def _watch(self, request: web.Request, mine: Any) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self.rv)
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        deadline = asyncio.get_running_loop().time() + int(request.query.get("timeoutSeconds", 60))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await response.write(json.dumps(event).encode() + b"\n")

        if since < self._oldest:
            await send(
                {
                    "type": "ERROR",
                    "object": status(
                        410, "Expired", f"too old resource version: {since} ({self._oldest})"
                    ),
                }
            )
            return response
        self.watches += 1
        expired = self._expired
        while not expired.is_set():
            for version, event in self._history:
                if version > since and mine(event["object"]):
                    await send(event)
            since = self.rv
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            changed = asyncio.ensure_future(self._changed.wait())
            gone = asyncio.ensure_future(expired.wait())
            done, pending = await asyncio.wait(
                {changed, gone}, timeout=min(left, 1.0), return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            if not done and bookmarks:
                await send(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": "EndpointSlice",
                            "apiVersion": "discovery.k8s.io/v1",
                            "metadata": {"resourceVersion": str(self.rv)},
                        },
                    }
                )
        return response

    async def pod_log(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        denied = self._forbidden("get", "pods/log", name)
        if denied is not None:
            return denied
        pod = self.pods.get(name)
        if pod is None or request.match_info["ns"] != self.namespace:
            return _error(404, "NotFound", f'pods "{name}" not found',
                          {"name": name, "kind": "pods"})  # fmt: skip
        if pod["status"].get("phase") != "Running":
            return _error(400, "BadRequest", f'container "vllm" in pod "{name}" is waiting '
                          "to start: ContainerCreating")  # fmt: skip
        tail = request.query.get("tailLines")
        text = self.logs.get(name, "")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) > 0 else ""
        if request.query.get("follow") != "true":
            return web.Response(text=text, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(text.encode())
        sent = len(self.logs.get(name, ""))
        while name in self.pods:
            changed = self._log_changed
            now = self.logs.get(name, "")
            if len(now) > sent:
                await response.write(now[sent:].encode())
                sent = len(now)
                continue
            await changed.wait()
        await response.write_eof()
        return response

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        apps = "/apis/apps/v1/namespaces/{ns}/{resource}/{name}/scale"
        app.router.add_route("GET", apps, self.scale)
        app.router.add_route("PATCH", apps, self.scale)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.pods_list)
        app.router.add_get("/api/v1/namespaces/{ns}/events", self.events_list)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self.pod_log)
        app.router.add_get(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self.endpointslices
        )
        return app


@asynccontextmanager
async def fake_kube(**options: Any) -> AsyncIterator[FakeKube]:
    """The stand-in on an ephemeral port of 127.0.0.1; `.url` is its base URL."""
    kube = FakeKube(**options)
    try:
        async with serve_app(kube.app()) as url:
            kube.url = url
            yield kube
    finally:
        kube.close()


def write_kubeconfig(directory: Path, server: str, token: str = "token-1") -> Path:
    """A kubeconfig whose current context reaches `server` with a bearer token read from
    a `tokenFile` beside it (rewrite `directory/token` to rotate it)."""
    (directory / "token").write_text(token)
    doc = {
        "current-context": "test",
        "contexts": [{"name": "test", "context": {"cluster": "stand-in", "user": "gw"}}],
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "gw", "user": {"tokenFile": "token"}}],
    }
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path
