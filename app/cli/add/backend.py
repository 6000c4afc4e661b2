"""The backend `microscheduler add` appends and the plan of its flags: pure.

The backend is planned exactly as the gateway will plan it (admission, `plan profile`):
its `model_info:` goes through `BackendConfig` and `app.planner.description.resolve`, its
share of the GPU through `app.planner.share.plan_share` (alone on the GPU), and its
`vllm serve` line through `app.planner.profile_plan.vllm_command`, so the printed flags are
the planner's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from app.cli.add.describe import Description
from app.cli.add.family import ToolParser
from app.planner.description import PlannedModel, resolve
from app.planner.footprint import backend_instance
from app.planner.profile_plan import vllm_command
from app.planner.share import InstancePlan, ShareRequest, plan_share
from app.settings import BackendConfig

RuntimeKind = Literal["docker", "process"]
Lifecycle = Literal["pinned", "lazy", "standby"]

# A Docker container name (the engine's rule) and a YAML key needing no quotes.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: The gateway polls these; vLLM leaves them out of its access log with this flag
#: (`vllm/entrypoints/common/cli_args.py:321`, docs/vllm.md).
QUIET_POLLS = ("--disable-access-log-for-endpoints", "/health,/metrics")


@dataclass(frozen=True)
class Request:
    """What was asked for, resolved (names, port, paths)."""

    name: str
    runtime: RuntimeKind
    port: int
    gpus: tuple[int, ...]  # its GPUs (more than one: tensor parallel across them)
    model_ref: str  # what vLLM loads: a repository id, or a path as the server sees it
    context: int | None
    kv_dtype: str | None
    lifecycle: Lifecycle
    sleep_mode: bool
    tool_parser: ToolParser | None
    vllm: str = "vllm"  # the process runtime's executable
    utilization: float | None = None  # pins --gpu-memory-utilization; None: the planner's
    # Docker, `gpus: auto`: one container per set of GPUs (each as many as `gpus`), the
    # gateway starts the one whose GPUs have room; empty: one container on `gpus`.
    placements: tuple[tuple[int, ...], ...] = ()

    @property
    def container(self) -> str:
        return f"vllm-{self.name}"

    @property
    def containers(self) -> list[tuple[tuple[int, ...], str]]:
        """Each container to create: its GPUs and its name (`vllm-NAME-gpu1`, and
        `vllm-NAME-gpu0-1` for a placement on GPUs 0 and 1)."""
        if not self.placements:
            return [(self.gpus, self.container)]
        return [(p, f"{self.container}-gpu{'-'.join(map(str, p))}") for p in self.placements]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Planned:
    """The backend as written, its plan on the GPU, and the server's arguments."""

    data: dict[str, object]  # the backend's mapping in models.yaml
    config: BackendConfig
    model: PlannedModel
    plan: InstancePlan
    serve_args: tuple[str, ...]  # after `vllm serve`: the model first
    env: dict[str, str]


def model_info(request: Request, description: Description) -> dict[str, object]:
    info = dict(description.model_info)
    info["repo"] = request.model_ref
    if request.context is not None:
        info["max_model_len"] = request.context
    if request.kv_dtype is not None:
        info["kv_dtype"] = request.kv_dtype
    if request.utilization is not None:
        info["gpu_memory_utilization"] = request.utilization
    return info


def backend_data(
    request: Request, description: Description, command: list[str] | None = None
) -> dict[str, object]:
    """The backend's mapping (`command`: the process runtime's, once planned)."""
    runtime: dict[str, object]
    if request.placements:
        runtime = {
            "kind": "docker",
            "placements": [
                {"gpus": list(gpus), "container": name} for gpus, name in request.containers
            ],
        }
    elif request.runtime == "docker":
        runtime = {"kind": "docker", "container": request.container}
    else:
        runtime = {"kind": "process", "command": command or ["vllm", "serve"]}
        if request.sleep_mode:
            runtime["env"] = {"VLLM_SERVER_DEV_MODE": "1"}
    data: dict[str, object] = {
        "url": request.url,
        "models": [request.name],
        "runtime": runtime,
        "lifecycle": request.lifecycle,
        "gpus": "auto" if request.placements else list(request.gpus),
        "start_timeout_s": 900,  # the first start downloads the weights
    }
    if request.placements and len(request.gpus) > 1:  # `auto` is one GPU unless told
        data["tensor_parallel_size"] = len(request.gpus)
    if request.sleep_mode:
        data["sleep_mode"] = True  # a container's environment is not seen by the gateway
    data["model_info"] = model_info(request, description)
    return data


def extra_args(request: Request) -> list[str]:
    """What the planner's line lacks: the tool parser and the quiet health polls; for a
    process, the loopback address (vLLM listens on every interface by default)."""
    args: list[str] = []
    if request.runtime == "process":
        args += ["--host", "127.0.0.1"]
    args += QUIET_POLLS
    if request.tool_parser is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", request.tool_parser.name]
    return args


def plan_backend(request: Request, description: Description, gpu_bytes: int) -> Planned:
    """Plan the backend alone on a GPU of `gpu_bytes`; `ValueError` for a description the
    settings refuse (as check-config would)."""
    config = BackendConfig.model_validate(backend_data(request, description))
    planned = resolve(config.model_info, config.hf_config)
    assert planned is not None  # it has a model_info
    spec = backend_instance(config, name=request.name)
    assert spec is not None
    plan = plan_share(ShareRequest(total_bytes=gpu_bytes, instances=(spec,))).instances[0]
    argv, env = vllm_command(config, planned, plan, sleep_mode=request.sleep_mode)
    serve_args = (*argv[2:], *extra_args(request))
    data = backend_data(request, description)
    if request.runtime == "process":
        data = backend_data(request, description, [request.vllm, "serve", *serve_args])
        config = BackendConfig.model_validate(data)
    return Planned(data, config, planned, plan, serve_args, env)
