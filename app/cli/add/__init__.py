"""`microscheduler add NAME --model MODEL --gpu-gib N`: plan a vLLM server for one model,
append it as a backend to `DIR/models.yaml`, and print the command that creates it.

- The model: a local directory or a Hugging Face repository id, described by its
  `config.json` (the directory's, else the Hugging Face cache's: `source`), else by the
  planner's catalog; nothing is downloaded. Without either, the command exits 2 naming the
  flags that give the sizes (`--hf-config`, or the shape flags with `--params-b` /
  `--weights-gib`), as `plan kv` / `plan context` take them.
- The flags: the planner's, for the backend alone on a GPU of `--gpu-gib` (`backend`);
  the tool-call parser of the model's family (`family`); vLLM's sleep mode unless
  `--no-sleep-mode`. A plan that does not fit writes nothing and exits 1 with why.
- models.yaml: the backend is added at the end of `backends:` as text (comments kept; the
  file is created when missing), and the whole result is validated by the loader
  `check-config` uses before it replaces the file (a temporary file renamed over it): a
  result the gateway would refuse is never left behind. A name already in use exits 2.
- The printed command (`launch`): `docker create` with the planned flags, the sleep-mode
  variable, the tool flags, the port on 127.0.0.1, the Hugging Face and vLLM caches on
  volumes and the backend's label (Docker runtime); `vllm serve` (process runtime, which
  the gateway runs itself from `runtime.command`).
- GPUs: `--gpu 1` (one container on GPU 1; `--gpu 0,1`: tensor parallel across both), or
  `--placements 0 1` (Docker, `gpus: auto`): one container per placement, written as
  `runtime.placements` and printed as one `docker create` each, the gateway starting the
  one whose GPUs have room (`--placements 0,1 2,3`: two tensor-parallel placements).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from app.cli.add.backend import NAME, Planned, Request, plan_backend
from app.cli.add.describe import Description, describe
from app.cli.add.family import family_text, tool_parser
from app.cli.add.launch import (
    DEFAULT_IMAGE,
    Mounts,
    container_model_path,
    docker_creates,
    shell_text,
    vllm_serve,
)
from app.cli.add.source import Found, find_model, hf_home, hub_cache, read_config, vllm_cache_root
from app.cli.add.yaml_text import backend_block, insert_backend
from app.cli.common import (
    FAILED,
    OK,
    USAGE,
    CommandFailed,
    Subparsers,
    UsageError,
    add_config_option,
    error,
    guarded,
    load_config,
    positive_int,
)
from app.cli.plan.model_args import add_shape_args
from app.planner.description import DEFAULT_MAX_MODEL_LEN, planned_context
from app.planner.units import bytes_to_gib, gib_to_bytes
from app.settings import MODELS_FILE, ConfigError, Settings, load_settings
from app.settings.root import ENV_PREFIX

FIRST_PORT = 8001


def add_add_command(subparsers: Subparsers) -> None:
    add = subparsers.add_parser(
        "add",
        help="plan a vLLM server for a model, add it to models.yaml, print its docker create",
        description="Plan vLLM's flags for MODEL on one GPU, append backend NAME to "
        "DIR/models.yaml (validated as check-config does; nothing is left behind when it "
        "is not valid) and print the `docker create` (or `vllm serve`) line that creates "
        "its server. Nothing is downloaded: the model's config.json comes from a local "
        "directory or the Hugging Face cache, else the planner's catalog, else the size flags.",
    )
    add.add_argument("name", help="the backend's name, its model id and its container's suffix")
    add.add_argument(
        "--model", required=True, help="a Hugging Face repository id (Qwen/Qwen3-8B) or a directory"
    )
    add.add_argument("--gpu-gib", type=float, required=True, help="the GPU's memory in GiB")
    add.add_argument(
        "--context",
        type=positive_int,
        help=f"--max-model-len (default {DEFAULT_MAX_MODEL_LEN}, or the model's limit if smaller)",
    )
    add.add_argument("--runtime", choices=("docker", "process"), default="docker")
    add_config_option(add)
    add.add_argument(
        "--port",
        type=positive_int,
        help=f"the server's port (default: the first free from {FIRST_PORT})",
    )
    add.add_argument(
        "--gpu",
        type=gpu_list,
        help="the GPU's index (default 0); a comma list (0,1): tensor parallel across them",
    )
    add.add_argument(
        "--placements",
        nargs="+",
        type=gpu_list,
        metavar="GPUS",
        help="docker: one container per placement, the gateway starts the one whose GPUs have "
        "room (gpus: auto): --placements 0 1 (a GPU each), --placements 0,1 2,3 (tensor "
        "parallel 2)",
    )
    add.add_argument(
        "--lifecycle",
        choices=("lazy", "pinned", "standby"),
        default="lazy",
        help="lazy (default): started on its first request; pinned: always running",
    )
    add.add_argument(
        "--no-sleep-mode",
        dest="sleep_mode",
        action="store_false",
        help="leave vLLM's sleep mode out (idle and evicted, it is stopped instead)",
    )
    add.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="pin vLLM's share of the GPU, e.g. 0.9 for more KV cache (default: the planner's, "
        "the least that holds one request of the full context)",
    )
    add.add_argument("--kv-dtype", help="--kv-cache-dtype: fp8 halves the KV cache (default: auto)")
    add.add_argument(
        "--image", default=DEFAULT_IMAGE, help=f"docker: the image (default {DEFAULT_IMAGE})"
    )
    add.add_argument("--vllm", default="vllm", help="process: the vllm executable (default: vllm)")
    add.add_argument("--dry-run", action="store_true", help="print, write nothing")
    sizes = add.add_argument_group(
        "sizes, when no config.json is at hand (as `plan context` takes them)"
    )
    add_shape_args(sizes)
    sizes.add_argument("--params-b", type=float, help="parameters in billions")
    sizes.add_argument("--weights-gib", type=float, help="the checkpoint's size in GiB")
    sizes.add_argument("--weight-dtype", help="with --params-b: bf16, fp8, awq, gptq, ...")
    add.set_defaults(func=guarded(run_add, lambda _: "add"))


def gpu_list(text: str) -> tuple[int, ...]:
    """An argparse type: GPU indexes, comma-separated (`0`, `0,1`), each listed once."""
    try:
        gpus = tuple(int(part) for part in text.split(","))
    except ValueError:
        gpus = ()
    if not gpus or min(gpus) < 0:
        raise argparse.ArgumentTypeError(f"GPU indexes (0, 1, ... or 0,1), got {text!r}")
    if len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"lists a GPU twice: {text!r}")
    return tuple(sorted(gpus))


def placements_of(args: argparse.Namespace) -> tuple[tuple[int, ...], ...]:
    """`--placements`, checked: docker only, not with --gpu, each of one size, none twice."""
    placements: list[tuple[int, ...]] = args.placements or []
    if not placements:
        return ()
    if args.runtime != "docker":
        raise UsageError(
            "--placements is for --runtime docker (a container's GPUs are fixed when it is "
            "created); a process backend is told its GPUs at each start: write gpus: auto"
        )
    if args.gpu is not None:
        raise UsageError("give --gpu (one container) or --placements (one per placement), not both")
    if len({len(p) for p in placements}) != 1:
        raise UsageError(
            f"--placements {' '.join(','.join(map(str, p)) for p in placements)}: every "
            "placement has as many GPUs (the tensor-parallel size)"
        )
    if len(set(placements)) != len(placements):
        raise UsageError("--placements lists a placement twice")
    return tuple(placements)


def config_dir(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    if args.config is not None:
        return Path(args.config)
    return Path(environ.get(f"{ENV_PREFIX}CONFIG_DIR", "config"))


def free_port(settings: Settings | None, wanted: int | None) -> int:
    """`wanted`, else the first port from FIRST_PORT that no backend's URL uses."""
    if wanted is not None:
        return wanted
    backends = settings.backends.values() if settings is not None else ()
    used = {urlsplit(backend.url).port for backend in backends}
    port = FIRST_PORT
    while port in used:
        port += 1
    return port


def run_add(args: argparse.Namespace) -> int:
    env = os.environ
    if not NAME.fullmatch(args.name):
        raise UsageError(
            f"{args.name!r} cannot name a backend and its container: use letters, digits, "
            "and . _ - (not first)"
        )
    if args.gpu_gib <= 0:
        raise UsageError(f"--gpu-gib must be a positive number, got {args.gpu_gib:g}")
    directory = config_dir(args, env)
    models_path = directory / MODELS_FILE
    settings = load_config(directory) if models_path.is_file() else None
    if settings is not None and args.name in settings.backends:
        error("add", f"backend {args.name!r} is already in {models_path}; pick another name")
        return USAGE
    found, local = _find(args, env)
    description = describe(args, found, where_looked=str(hub_cache(env)))
    request = _request(args, settings, description, local)
    planned = plan_backend(request, description, gib_to_bytes(args.gpu_gib))
    _summary(args, request, description, planned)
    if not planned.plan.ok:
        _does_not_fit(planned)
        return FAILED
    comment = f"added by `microscheduler add`: {args.model} on a {args.gpu_gib:g} GiB GPU"
    old = models_path.read_text(encoding="utf-8") if models_path.is_file() else ""
    text = insert_backend(old, args.name, planned.data, comment=comment)
    settings = _write(directory, models_path, text, args.name, dry_run=args.dry_run)
    if args.dry_run:
        block = backend_block(args.name, planned.data, indent=2, comment=comment)
        print(
            f"\n--dry-run: nothing written; {models_path} would get under backends (and "
            "check-config would accept it):\n"
        )
        print(block, end="")
    else:
        print(f"\nadded backend {args.name!r} to {models_path} (check-config accepts it)")
    _launch(args, request, planned, local, env)
    if request.runtime == "docker" and not settings.docker.url.startswith("unix://"):
        print(
            f"\nnote: the gateway reaches Docker through {settings.docker.url}: when it runs in "
            f"a container itself (docker-compose.yml), it cannot reach {request.url}; put "
            f"{_on_network(request)} on its network (--network) and set the backend's url to "
            f"http://{request.container}:{request.port}"
        )
    _next_steps(args, request, directory, settings.port)
    return OK


def _on_network(request: Request) -> str:
    if not request.placements:
        return request.container
    # One runs at a time: the name they share is a network alias of each.
    return f"each placement's container, with --network-alias {request.container},"


def _find(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Found | None, Path | None]:
    """The model's config.json on disk (if any), and the local model directory (if any)."""
    local = Path(args.model).expanduser()
    local_dir = local.resolve() if local.is_dir() else None
    if args.hf_config is not None:
        return read_config(Path(args.hf_config)), local_dir
    return find_model(args.model, env), local_dir


def _request(
    args: argparse.Namespace,
    settings: Settings | None,
    description: Description,
    local: Path | None,
) -> Request:
    try:
        context = planned_context(args.context, description.model.max_context)
    except ValueError as exc:
        raise UsageError(f"--context {exc}") from None
    if local is None:
        model_ref = args.model
    elif args.runtime == "docker":
        model_ref = container_model_path(args.name)
    else:
        model_ref = str(local)
    repo_name = local.name if local is not None else args.model
    placements = placements_of(args)
    return Request(
        name=args.name,
        runtime=args.runtime,
        port=free_port(settings, args.port),
        gpus=placements[0] if placements else args.gpu or (0,),
        placements=placements,
        model_ref=model_ref,
        context=context,
        kv_dtype=args.kv_dtype,
        lifecycle=args.lifecycle,
        sleep_mode=args.sleep_mode,
        tool_parser=tool_parser(description.config, repo_name),
        vllm=args.vllm,
        utilization=args.gpu_memory_utilization,
    )


def _summary(
    args: argparse.Namespace, request: Request, description: Description, planned: Planned
) -> None:
    plan, model = planned.plan, planned.model
    limit = description.model.max_context
    print(f"{request.name}: {args.model}, described by {description.source}")
    for note in description.notes:
        print(f"  {note}")
    context = f"context {model.max_model_len:,} tokens" + (
        f" (the model takes up to {limit:,}: --context)" if limit else ""
    )
    where = f"alone on a {args.gpu_gib:g} GiB GPU"
    if (n := len(request.gpus)) > 1:  # the planner's numbers are per GPU
        where = f"per GPU (tensor parallel {n}, alone on {n} GPUs of {args.gpu_gib:g} GiB)"
    if plan.ok:
        print(
            f"  plan {where}: {' '.join(plan.flags)}; {context}; "
            f"KV cache {bytes_to_gib(plan.kv_bytes):.2f} GiB ({model.kv_dtype.name}); "
            f"expected use {bytes_to_gib(plan.expected_used_bytes):.2f} GiB"
        )
    else:
        print(f"  plan {where}: {context}, {model.kv_dtype.name} KV")
    for note in plan.notes:
        print(f"  note: {note}")
    if request.tool_parser is not None:
        print(
            f"  tool calls: --enable-auto-tool-choice --tool-call-parser "
            f"{request.tool_parser.name} (vLLM's parser for {request.tool_parser.family})"
        )
    else:
        print(
            f"  tool calls: no parser known for this family ({family_text(description.config)}): "
            "the tool flags are left out, and requests with tools get a 400 from vLLM; "
            "add --enable-auto-tool-choice --tool-call-parser NAME by hand (docs/vllm.md)"
        )
    if request.sleep_mode:
        print(
            "  sleep mode: --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (its /sleep and "
            "/wake_up); idle or evicted, it sleeps instead of stopping (--no-sleep-mode: stops)"
        )


def _does_not_fit(planned: Planned) -> None:
    plan = planned.plan
    print("\nit does not fit, so nothing was written:")
    for problem in plan.problems:
        print(f"  why: {problem}")
    for advice in plan.advice:
        print(f"  advice: {advice}")
    print(
        "  try: a shorter --context, --kv-dtype fp8 (half the KV cache), a quantized "
        "checkpoint of the model (AWQ/GPTQ) as --model, or a bigger GPU"
    )


def _write(directory: Path, models_path: Path, text: str, name: str, *, dry_run: bool) -> Settings:
    """Validate `text` as the directory's models.yaml with check-config's loader, then put
    it in place (a rename; `dry_run`: not). `CommandFailed(1)` with the loader's problems
    when it is not valid: the file is left as it was."""
    with contextlib.ExitStack() as stack:
        if dry_run and not directory.is_dir():  # validated in a directory of its own
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{MODELS_FILE}.", suffix=".tmp", dir=directory)
        tmp = Path(tmp_name)
        stack.callback(tmp.unlink, missing_ok=True)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        tmp.chmod(models_path.stat().st_mode & 0o7777 if models_path.is_file() else 0o644)
        try:
            settings = load_settings(directory, models_file=tmp)
        except ConfigError as exc:
            error("add", f"{models_path} would not be valid with backend {name!r}; left unchanged")
            for problem in exc.problems:
                print(f"  {problem}", file=sys.stderr)
            raise CommandFailed(FAILED) from None
        assert name in settings.backends, "the backend did not land under backends:"
        if not dry_run:
            tmp.replace(models_path)
        return settings


def _launch(
    args: argparse.Namespace,
    request: Request,
    planned: Planned,
    local: Path | None,
    env: Mapping[str, str],
) -> None:
    if request.runtime == "process":
        lines = vllm_serve(request, planned.serve_args, planned.env)
        print(
            "\nThe gateway starts it itself (runtime.command in models.yaml); to try it by "
            "hand first:\n"
        )
        print(shell_text(lines))
        return
    home = hf_home(env)
    hub = hub_cache(env)
    mounts = Mounts(
        hf_home=home,
        hub_cache=None if hub == home / "hub" else hub,
        vllm_cache=vllm_cache_root(env),
        local_model=local,
    )
    creates = docker_creates(request, planned.serve_args, planned.env, mounts, image=args.image)
    if not request.placements:
        print(
            f"\nCreate its container (the gateway starts and stops it by name, "
            f"{request.container}):\n"
        )
        print(shell_text(creates[0]))
        return
    names = ", ".join(name for _, name in request.containers)
    print(
        f"\nCreate its containers, one per placement ({names}): the gateway starts the one "
        "whose GPUs have room, one at a time (they share the port):\n"
    )
    print("\n\n".join(shell_text(lines) for lines in creates))


def _next_steps(args: argparse.Namespace, request: Request, directory: Path, port: int) -> None:
    config = f" --config {directory}" if args.config is not None else ""
    print(
        f"\nThen: microscheduler check-config{config}\n"
        f"      microscheduler serve{config}\n"
        f"      curl -s localhost:{port}/v1/chat/completions -H 'content-type: application/json' "
        f'-d \'{{"model": "{request.name}", "messages": [{{"role": "user", '
        '"content": "hello"}]}\''
    )
