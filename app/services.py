"""Services: the object graph, built once per app in the lifespan. No globals, no policy.

Builds every long-lived object from the settings and the seams, wires them together, and
closes what it opened (connection pools, the Docker and Kubernetes clients, the GPU source)
in reverse order. What runs in the background (bring-up, health watch, reaper, scrape, GPU poll) is
the `Supervisor`'s.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.activity import Activity
from app.control.schedule import zone
from app.control.scheduler import Clock, Scheduler, SystemClock
from app.control.supervisor import Supervisor
from app.events import EventLog
from app.gpu.auto import AutoProbe, auto_probes
from app.gpu.collector import GpuCollector
from app.gpu.host_ram import (
    FixedRamSource,
    HostRamMonitor,
    MeminfoSource,
    NodeExporterSource,
    RamSource,
)
from app.gpu.ledger import read_ledger
from app.gpu.nvml import NvmlSource
from app.gpu.poller import GpuMonitor
from app.gpu.prometheus import PrometheusSource
from app.gpu.sim import SimSource
from app.gpu.telemetry import GpuSource
from app.keys.metrics import KeyMetrics
from app.lifecycle.admission import Unchecked
from app.lifecycle.backend import Backend
from app.lifecycle.load import StartDurations
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.profile_switch import ProfileSwitch
from app.lifecycle.served import LearnedRecords
from app.lifecycle.store import RETRY_FIRST_S, ProcessRecords, StateStore, earlier_shared_state
from app.metrics import OutputMetrics, PoolMetrics
from app.notify.notifier import Notifier
from app.routing.cloud import Cloud
from app.routing.plane import PlaneInputs, build_plane
from app.routing.rebuilds import Rebuilds
from app.runtimes.base import Runtime
from app.runtimes.child_env import child_environment
from app.runtimes.docker import DockerRuntime
from app.runtimes.docker_api import DockerApi
from app.runtimes.external import ExternalRuntime
from app.runtimes.kube_api import KubeApi
from app.runtimes.kubernetes import KubernetesRuntime
from app.runtimes.port_check import address_of
from app.runtimes.process import ProcessRuntime, sweep_orphans
from app.runtimes.process_record import launch_hash
from app.settings import (
    LOCAL_HOST,
    BackendConfig,
    DockerRuntimeConfig,
    GpuConfig,
    KubernetesRuntimeConfig,
    ProcessRuntimeConfig,
    Settings,
)
from app.settings.record import ConfigRecord
from app.store.usage import build_ledger
from app.tasks import OpenRelays, OwnedTasks
from app.upstreams.control_http import DEFAULT_TIMEOUT_S, AsyncBaseTransport, async_client
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import VllmClient, control_timeout_s
from app.upstreams.vllm_load import VllmLoadMetrics
from app.vram.arbiter import VramArbiter
from app.vram.auto_yield import AutoYield
from app.vram.host_ram import HostRamBook, HostRamCollector
from app.vram.hosts import Host, Hosts
from app.vram.yielding import VramYield

logger = logging.getLogger(__name__)

RuntimeFactory = Callable[[str, BackendConfig], Runtime]
GpuSourceFactory = Callable[[Callable[[], dict[int, int]]], GpuSource]


@dataclass(frozen=True)
class Seams:
    """What tests (and later features) may replace: transports, runtimes, the GPU source.

    `runtime_factory=None` builds the runtime each backend's config names;
    `gpu_source_factory=None` builds the source `gpu.probe` names (it receives the
    gateway's placed-memory callback, which the simulated GPU without a ledger reports
    as used); it replaces the local host's source only (`hosts:` use their config).
    `ram_source` replaces the local host's RAM reading (/proc/meminfo).
    `nvml` replaces the `pynvml` module for the local host (`gpu.probe: auto` asks it
    whether there is a GPU, `nvml` reads through it): a test never asks the real driver.
    `clock` is the schedules' wall clock and wait (`app.control.scheduler`).
    `poll_clock` is the monotonic clock the health watch and the scrape space an idle
    backend's polls by (`app.control.polling`).
    `state_retry_first_s` is the wait before the state file's first save retry after a
    failed save (`app.lifecycle.store`; it doubles from there).
    """

    control_transport: AsyncBaseTransport | None = None
    docker_transport: AsyncBaseTransport | None = None
    kube_transport: AsyncBaseTransport | None = None
    runtime_factory: RuntimeFactory | None = None
    gpu_source_factory: GpuSourceFactory | None = None
    ram_source: RamSource | None = None  # the local host's RAM (default /proc/meminfo)
    nvml: object | None = None  # the pynvml module (default: imported)
    clock: Clock | None = None  # the schedules' (default: time.time and asyncio.sleep)
    poll_clock: Callable[[], float] | None = None  # idle polls' (default: time.monotonic)
    state_retry_first_s: float = RETRY_FIRST_S


class Services:
    def __init__(
        self,
        settings: Settings,
        metrics: LifecycleMetrics,
        seams: Seams,
        *,
        activity: Activity | None = None,
        probes: Mapping[str, AutoProbe] | None = None,
    ) -> None:
        """`probes`: what `gpu.probe: auto` found on each host with it (`auto_probes`, run
        off the event loop by the app's start-up); None: asked here."""
        self.settings = settings
        self._probes = probes
        self.metrics = metrics
        # The last requests (`GET /activity`); the access middleware records them.
        self.activity = activity if activity is not None else Activity(settings.activity_size)
        self.started_at = time.time()
        # The control plane's HTTP client (health, sleep mode, scrapes); client requests
        # go through each backend's own `HttpUpstream`.
        self.control_client = async_client(
            timeout=DEFAULT_TIMEOUT_S, transport=seams.control_transport
        )
        self.events = EventLog()
        # Notifications (`notify:`), fed by the events; the reloader swaps their targets.
        self.notifier = Notifier(settings.notify, metrics.registry)
        self.events.listen(self.notifier.on_event)
        self._seams = seams
        self.key_metrics = KeyMetrics(metrics.registry)
        self.relays = OpenRelays()  # ended in-band when the gateway stops (app.main)
        self.loads = OwnedTasks()  # loads a client began without waiting (app.api.model_verbs)
        self._build_clients()
        self._build_store()
        self._build_hosts()
        self._build_loops()
        self.rebuilds = Rebuilds()  # the backends a reload is rebuilding: requests wait
        # What every routing plane of this gateway is built over (the same objects).
        self.plane_inputs = PlaneInputs(
            self.backends,
            metrics,
            self.key_metrics,
            self.events,
            self.rebuilds,
            self.vllm_load.load_of,
            self._fell_to_cloud,
        )
        # The routing plane (registry, cloud, keys, auth, dispatcher): built here and by a
        # reload with the one `build_plane`; a reload replaces it in one assignment, and a
        # request reads it once (`app.api.deps.plane_of`).
        self.plane = build_plane(settings, self.plane_inputs)
        self.retired: list[Cloud] = []  # clouds a reload replaced: closed with the gateway
        # The configuration running (`/status` config); `app.reload` reloads it.
        self.config_record = ConfigRecord(settings.config_dir, metrics.registry)

    def _build_clients(self) -> None:
        """The runtimes' API clients: one Docker client per host that runs docker
        backends, one Kubernetes client when a backend runs there."""
        settings = self.settings
        self.dockers: dict[str, DockerApi] = {}
        for cfg in settings.backends.values():
            if isinstance(cfg.runtime, DockerRuntimeConfig):
                self._docker(cfg.host_name)
        self.kube: KubeApi | None = None
        if any(isinstance(c.runtime, KubernetesRuntimeConfig) for c in settings.backends.values()):
            self.kube = KubeApi(settings.kubernetes, transport=self._seams.kube_transport)

    def _build_store(self) -> None:
        """The store (state.db): zones, the yield, the profile and the processes this
        gateway started survive restarts there, and the usage ledger (cloud budgets)."""
        settings = self.settings
        earlier = earlier_shared_state(settings.state_dir, settings.config_dir)
        if earlier is not None:
            logger.warning(
                "state of an earlier version not used: it kept every configuration's state "
                "in %s; to carry it over to this configuration, stop the gateway and move "
                "%s* into %s, or set MICROSCHEDULER_STATE_DIR=%s path=%s state_dir=%s",
                earlier.parent, earlier, settings.state_dir, earlier.parent, earlier,
                settings.state_dir,
            )  # fmt: skip
        self.usage = build_ledger(settings, self.metrics.registry)
        self.store = StateStore(
            settings.state_dir,
            metrics=self.metrics,
            on_change=self.events.changed,
            retry_first_s=self._seams.state_retry_first_s,
            writer=self.usage.writer,
        )
        self._processes = ProcessRecords(self.store)
        self._learned = LearnedRecords(self.store)  # what each server said it serves
        self._durations = StartDurations(self.store)  # for the eta of a start

    def _build_hosts(self) -> None:
        """Each host's arbiter (its GPUs) and RAM book, the backends, and the hosts."""
        settings = self.settings
        configured = {LOCAL_HOST: settings.gpu, **{n: h.gpu for n, h in settings.hosts.items()}}
        # `auto` resolved once, here: nvml, or none with the warning saying why.
        resolved = {name: self._resolve_probe(name, gpu) for name, gpu in configured.items()}
        gpus = {name: gpu for name, (gpu, _) in resolved.items()}
        self.probe_warnings = {n: w for n, (_, w) in resolved.items() if w is not None}
        arbiters = {name: self._build_arbiter(name, gpu, self._seams) for name, gpu in gpus.items()}
        monitors = {n: a.monitor for n, a in arbiters.items() if a.monitor is not None}
        if monitors:
            self.metrics.registry.register(GpuCollector(monitors))
        books = {name: self._build_ram_book(name, arbiters[name], self._seams) for name in gpus}
        self.metrics.registry.register(HostRamCollector(books))
        self._runtime_factory = self._seams.runtime_factory or self._build_runtime
        self.backends = {
            name: self._build_backend(name, cfg, self._runtime_factory(name, cfg), arbiters, books)
            for name, cfg in settings.backends.items()
        }
        self.metrics.watch_placements(self.backends)  # backend_gpu, read at each scrape
        # Each host's backends (the dicts its arbiter, RAM book and yield read; a reload
        # adds and removes entries in place).
        self.host_backends: dict[str, dict[str, Backend]] = {}
        self.hosts = Hosts(
            {
                name: self._build_host(name, gpu, arbiters[name], books[name])
                for name, gpu in gpus.items()
            }
        )

    def _build_loops(self) -> None:
        """What runs by itself: the GPU profiles, the vLLM load scrape, the supervisor's
        loops and the schedules."""
        settings = self.settings
        self.profiles = ProfileSwitch(
            settings.gpu_profiles,
            self.backends,
            self.store,
            self.metrics,
            self.events,
            on_switch=self._replan,
        )
        self.vllm_load = vllm_load = VllmLoadMetrics(self.metrics.registry)
        for name in self.backends:
            vllm_load.declare(name)
        wanted = {
            name: launch_hash(cfg)
            for name, cfg in settings.backends.items()
            if isinstance(cfg.runtime, ProcessRuntimeConfig)
        }
        self.supervisor = Supervisor(
            settings,
            self.backends,
            self.hosts,
            self.profiles,
            vllm_load,
            sweep=functools.partial(sweep_orphans, self._processes, wanted),
            poll_clock=self._seams.poll_clock,
        )
        self.scheduler = Scheduler(
            settings.schedules,
            zone(settings.timezone),
            self._seams.clock or SystemClock(),
            vram_yield=self.hosts[LOCAL_HOST].vram_yield,
            profiles=self.profiles,
            backends=self.backends,
            events=self.events,
        )

    def _fell_to_cloud(self, **fields: object) -> None:
        # The first per key per hour is an event (and so a notification), not every one.
        if self.notifier.first_this_hour(str(fields["key"])):
            self.events.record("fallback_to_cloud", **fields)

    def build_backend(self, name: str, config: BackendConfig) -> Backend:
        """A backend added or rebuilt by a reload (on the hosts already running)."""
        arbiters = {n: h.arbiter for n, h in self.hosts.items()}
        books = {n: h.ram for n, h in self.hosts.items()}
        runtime = self._runtime_factory(name, config)
        backend = self._build_backend(name, config, runtime, arbiters, books)
        self.vllm_load.declare(name)
        return backend

    def _build_backend(
        self,
        name: str,
        config: BackendConfig,
        runtime: Runtime,
        arbiters: dict[str, VramArbiter],
        books: dict[str, HostRamBook],
    ) -> Backend:
        headers = _upstream_auth(name, config)
        return Backend(
            name,
            config,
            runtime,
            HttpUpstream(
                name,
                config.url,
                self.settings.backend_timeouts(name),
                max_connections=config.max_connections,
                extra_headers=headers,
                observer=PoolMetrics(self.metrics, name),
                role="backend",
            ),
            VllmClient(
                self.control_client,
                config.url,
                headers=headers,
                health_path=config.health_path,
                timeout_s=control_timeout_s(
                    self.settings.backend_timeouts(name).control_s, config.weights_bytes
                ),
            ),
            self.metrics,
            # The cluster's scheduler places a kubernetes backend without `host:`.
            admission=arbiters[config.host_name] if config.gpus_accounted else Unchecked(),
            wake_notice_s=self.settings.wake_notice_s,
            start_cancel_grace_s=self.settings.start_cancel_grace_s,
            events=self.events,
            learned=self._learned,
            # A kubernetes backend without `host:` runs on a node nobody here reads.
            release=books[config.host_name] if config.gpus_accounted else None,
            durations=self._durations,
        )

    def _build_ram_book(self, host: str, arbiter: VramArbiter, seams: Seams) -> HostRamBook:
        """A host's RAM book: /proc/meminfo for the gateway's own machine, node-exporter
        through the Prometheus of its GPU probe for another (none: no reading); `host_ram.sim`
        (tests, demos) in place of either."""
        config = self.settings.host_ram_of(host)
        source: RamSource | None = None
        if host == LOCAL_HOST and seams.ram_source is not None:
            source = seams.ram_source
        elif config.sim is not None:
            source = FixedRamSource(config.sim.total_mib, config.sim.available_mib)
        elif host == LOCAL_HOST:
            source = MeminfoSource()
        elif arbiter.monitor is not None and isinstance(arbiter.monitor.source, PrometheusSource):
            prometheus = arbiter.monitor.source
            source = NodeExporterSource(
                prometheus, config.selector, min_interval_s=prometheus.query_interval_s
            )
        monitor = (
            None
            if source is None
            else HostRamMonitor(source, host=host, poll_interval_s=config.poll_interval_s)
        )
        return HostRamBook(host, config, monitor, self.events)

    def _resolve_probe(self, host: str, gpu: GpuConfig) -> tuple[GpuConfig, str | None]:
        """`gpu` with `auto` replaced by what it found (`app.gpu.auto`), and its warning."""
        if gpu.probe != "auto":
            return gpu, None
        if host == LOCAL_HOST and self._seams.gpu_source_factory is not None:
            return gpu.model_copy(update={"probe": "nvml"}), None  # the test's source
        if self._probes is None:  # built without the start-up's answer: ask now
            self._probes = auto_probes(self.settings, nvml=self._seams.nvml)
        found = self._probes[host]
        warning = found.warning
        if warning is not None:
            logger.warning("gpu probe host=%s: %s", host, warning)
        else:
            logger.info("gpu probe host=%s: auto found NVML and a GPU: probe nvml", host)
        return gpu.model_copy(update={"probe": found.probe}), warning

    def _build_arbiter(self, host: str, gpu: GpuConfig, seams: Seams) -> VramArbiter:
        """A host's arbiter over its GPU monitor (none: no telemetry, admission off)."""
        arbiter: VramArbiter | None = None

        # The source is built before the arbiter it reports for: read it when asked.
        def placed() -> dict[int, int]:
            assert arbiter is not None
            return arbiter.placed_mib()

        monitor = self._build_monitor(host, gpu, seams, placed)
        arbiter = VramArbiter(
            monitor,
            self.store,
            reclaim_timeout_s=gpu.reclaim_timeout_s,
            events=self.events,
            metrics=self.metrics,
            host=host,
            policy=gpu.placement,
        )
        return arbiter

    def _build_monitor(
        self, host: str, gpu: GpuConfig, seams: Seams, placed: Callable[[], dict[int, int]]
    ) -> GpuMonitor | None:
        source: GpuSource
        if seams.gpu_source_factory is not None and host == LOCAL_HOST:
            source = seams.gpu_source_factory(placed)
        elif gpu.probe == "nvml":
            nvml = seams.nvml if host == LOCAL_HOST else None
            source = NvmlSource(timeout_s=gpu.sample_timeout_s, nvml=nvml)
        elif gpu.probe == "prometheus":
            assert gpu.prometheus is not None  # GpuConfig requires it
            where = "gpu" if host == LOCAL_HOST else f"hosts.{host}.gpu"
            source = PrometheusSource(gpu.prometheus, key=f"{where}.prometheus")
        elif gpu.probe == "sim":
            ledger = gpu.sim.ledger_dir
            used: Callable[[], dict[int, int]] = placed
            if ledger is not None:
                used = lambda: read_ledger(ledger, now=time.time())  # noqa: E731
            source = SimSource(gpu.sim.total_mib, gpu.sim.count, used)
        else:
            return None
        return GpuMonitor(
            source,
            poll_interval_s=gpu.poll_interval_s,
            stale_after_s=gpu.stale_after_s,
            on_sample=self.events.changed,
            host=host,
        )

    def _build_host(
        self, name: str, gpu: GpuConfig, arbiter: VramArbiter, ram: HostRamBook
    ) -> Host:
        backends = {
            n: b
            for n, b in self.backends.items()
            if b.config.gpus_accounted and b.config.host_name == name
        }
        self.host_backends[name] = backends
        arbiter.attach(backends)
        ram.attach(backends)
        vram_yield = VramYield(
            arbiter,
            backends,
            self.metrics,
            self.events,
            settle_timeout_s=gpu.reclaim_timeout_s,
        )
        auto_yield = (
            AutoYield(gpu.auto_yield, vram_yield, arbiter, self.events)
            if gpu.auto_yield.enabled
            else None
        )
        warning = self.probe_warnings.get(name)
        return Host(name, gpu, arbiter, vram_yield, auto_yield, backends, ram, warning)

    def _build_runtime(self, name: str, config: BackendConfig) -> Runtime:
        if isinstance(config.runtime, ProcessRuntimeConfig):
            return ProcessRuntime(
                name,
                config.runtime,
                env=child_environment(self.settings, name, os.environ),
                book=self._processes,
                launch=launch_hash(config),
                output_dir=self.settings.state_dir / "logs",
                port=urlsplit(config.url).port,
                address=address_of(config.url),
                counts=OutputMetrics(self.metrics, name),
            )
        if isinstance(config.runtime, DockerRuntimeConfig):
            return DockerRuntime(name, config.runtime, self._docker(config.host_name))
        if isinstance(config.runtime, KubernetesRuntimeConfig):
            if self.kube is None:  # the first kubernetes backend, added by a reload
                self.kube = KubeApi(self.settings.kubernetes, transport=self._seams.kube_transport)
            return KubernetesRuntime(name, config.runtime, self.kube)
        return ExternalRuntime(config.url)

    def _docker(self, host: str) -> DockerApi:
        """The Docker client of `host`, built on first use."""
        if host not in self.dockers:
            settings = self.settings
            docker = settings.docker if host == LOCAL_HOST else settings.hosts[host].docker
            assert docker is not None  # settings.hosts.check_hosts refuses it
            where = {} if host == LOCAL_HOST else {"url_key": f"hosts.{host}.docker.url"}
            transport = self._seams.docker_transport
            self.dockers[host] = DockerApi(docker, transport=transport, **where)
        return self.dockers[host]

    def _replan(self) -> None:
        # The supervisor is built after the profile switch that calls this on a switch.
        self.supervisor.plan_footprints()

    async def start(self) -> None:
        self.notifier.start()
        await self.usage.start(
            self.plane.keys, self.activity, restore_activity=self.settings.store.activity_restore
        )
        await self.supervisor.start()
        self.scheduler.start()  # after the saved yield and profile are back

    async def close(self) -> None:
        """Stop the background work, then close what was opened, in reverse order."""
        await self.loads.close()
        await self.scheduler.close()
        await self.supervisor.close()
        await self.notifier.close()
        await self.store.close()  # after the reaper: a last try to save an ended hold
        await self.usage.close()  # the last usage and activity written; the store closed
        for backend in self.backends.values():
            await backend.upstream.close()
        await self.plane.cloud.close()
        for cloud in self.retired:
            await cloud.close()
        await self.control_client.aclose()
        for docker in self.dockers.values():
            await docker.aclose()
        if self.kube is not None:
            await self.kube.aclose()  # and its EndpointSlice watches
        for host in self.hosts.values():
            if host.monitor is not None:
                await host.monitor.close()


def _upstream_auth(name: str, config: BackendConfig) -> dict[str, str] | None:
    """The upstream's own key (vLLM `--api-key`), read from the variable the config names."""
    if config.api_key_env is None:
        return None
    key = os.environ.get(config.api_key_env)
    if not key:
        logger.warning(
            "upstream key variable is unset, sending no key backend=%s variable=%s",
            name,
            config.api_key_env,
        )
        return None
    return {"authorization": f"Bearer {key}"}
