"""``microscheduler plan ...``: the command-line face of the GPU memory planners.

This module wires the parser; the commands live in `sizing` (kv, context, gpus), `share`,
`profile` and `backend`, the model flags in `model_args`. Files are read here, never in
`app.planner` (``--hf-config``, the configuration for ``plan profile``). Every handler
returns 0 on success and 2 on bad input after one ``error: plan <command>: ...`` line on
stderr; an invalid configuration lists every problem and exits 1 (see `app.cli.common`).
A plan that does not fit (``share``, ``profile``, ``gpus``) is printed and exits 1
(``"fits": false``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from app.cli.common import Handler, Subparsers, add_config_option, add_json_option, guarded
from app.cli.plan.backend import add_backend_args, run_backend
from app.cli.plan.model_args import add_shape_args
from app.cli.plan.profile import run_profile
from app.cli.plan.share import run_share
from app.cli.plan.sizing import run_context, run_gpus, run_kv
from app.planner.catalog import catalog_names
from app.planner.share import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    DEFAULT_INSTANCE_OVERHEAD_BYTES,
    DEFAULT_UTILIZATION_STEP,
)
from app.planner.sizing import (
    DEFAULT_ALIGNMENT,
    DEFAULT_MAX_GPUS,
    DEFAULT_SIZING_CONTEXT,
    DEFAULT_UTILIZATION,
    DEFAULT_WEIGHT_EXPANSION,
)
from app.planner.units import bytes_to_gib


def add_plan_command(subparsers: Subparsers) -> None:
    """Add ``plan`` with its ``kv``, ``context``, ``gpus``, ``share``, ``profile`` and
    ``backend`` commands."""
    plan = subparsers.add_parser(
        "plan",
        help="size KV caches, context lengths, GPU counts and shared-GPU vLLM flags",
        description="GPU memory planning for vLLM instances (no GPU needed).",
    )
    commands = plan.add_subparsers(
        dest="plan_command", metavar="{kv,context,gpus,share,profile,backend}", required=True
    )
    for add_parser, handler in _SUBCOMMANDS:
        parser = add_parser(commands)
        add_json_option(parser)
        parser.set_defaults(func=guarded(handler, _command))


def _add_kv(commands: Subparsers) -> argparse.ArgumentParser:
    kv = commands.add_parser(
        "kv",
        help="KV-cache bytes per token (and for a context x sequences)",
        description="KV-cache size: 2 x layers x kv_heads x head_dim x bytes per element "
        "(MLA: layers x (kv_lora_rank + rope_head_dim) x bytes).",
    )
    _add_model_args(kv)
    kv.add_argument("--context", type=int, help="tokens per sequence")
    kv.add_argument("--seqs", type=int, default=1, help="concurrent sequences (default 1)")
    return kv


def _add_context(commands: Subparsers) -> argparse.ArgumentParser:
    context = commands.add_parser(
        "context",
        help="longest context (--max-model-len) that fits on N GPUs (KAITO's method)",
        description="usable = GPU x utilization; remaining = usable - weights x 1.02 / N - "
        "overhead; tokens = remaining / (bytes per token / N), clamped and aligned to 256.",
    )
    _add_sizing_args(context)
    context.add_argument(
        "--gpus",
        "--tensor-parallel-size",
        "-tp",
        dest="gpus",
        type=int,
        default=1,
        help="GPUs (tensor parallel), default 1",
    )
    context.add_argument(
        "--model-limit", type=int, help="context limit (default: the model's max positions)"
    )
    return context


def _add_gpus(commands: Subparsers) -> argparse.ArgumentParser:
    gpus = commands.add_parser(
        "gpus",
        help="fewest GPUs and nodes that hold a model and its KV cache",
        description="smallest N with weights x 1.02 / N + overhead + context x bytes per "
        "token / N <= usable, and N a divisor of the model's attention heads (vLLM: the "
        "tensor-parallel size must divide them). Tensor parallelism stays within a node: "
        "with --gpus-per-node and no tensor-parallel size up to it enough, tensor parallel "
        "within each node x pipeline parallel across nodes.",
    )
    _add_sizing_args(gpus)
    gpus.add_argument(
        "--context",
        type=int,
        default=DEFAULT_SIZING_CONTEXT,
        help=f"context to size for (default {DEFAULT_SIZING_CONTEXT})",
    )
    gpus.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs in one node: tensor parallel within it, pipeline parallel across nodes "
        "(default: one node holds them all)",
    )

    gpus.add_argument(
        "--max-gpus",
        type=int,
        default=DEFAULT_MAX_GPUS,
        help=f"search limit (default {DEFAULT_MAX_GPUS})",
    )
    return gpus


def _add_share(commands: Subparsers) -> argparse.ArgumentParser:
    share = commands.add_parser(
        "share",
        help="--gpu-memory-utilization / --kv-cache-memory-bytes for vLLM instances sharing a GPU",
        description="Instances are started in the order given. Each --instance is a comma-"
        "separated list of key=value items and flags: name, weights-gib | params-b [+ "
        "weight-dtype] | model, kv-gib | context [+ seqs] + (bytes-per-token | model "
        "[+ kv-dtype]), graphs-gib, eager, overhead-gib (default "
        f"{bytes_to_gib(DEFAULT_INSTANCE_OVERHEAD_BYTES):g}), cuda-context-gib (default "
        f"{bytes_to_gib(DEFAULT_CUDA_CONTEXT_BYTES):g}), util (check a given "
        "--gpu-memory-utilization), mode=auto|utilization|kv-bytes (kv-bytes alone = "
        "mode=kv-bytes: use --kv-cache-memory-bytes), graphs-outside-budget (its vLLM runs "
        "with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 or is older than 0.21).",
    )
    share.add_argument("--gpu-gib", type=float, required=True, help="GPU memory in GiB")
    share.add_argument(
        "--instance",
        action="append",
        required=True,
        metavar="SPEC",
        help="e.g. name=A,weights-gib=6.4,kv-gib=1.6,graphs-gib=8,overhead-gib=4.7",
    )
    share.add_argument(
        "--baseline-gib",
        type=float,
        default=0.0,
        help="memory other processes hold before the first instance starts",
    )
    share.add_argument(
        "--reserve-gib", type=float, default=0.0, help="memory that must stay free at the end"
    )
    graphs = share.add_mutually_exclusive_group()
    graphs.add_argument(
        "--graphs-outside-budget",
        action="store_true",
        help="CUDA graphs come on top of --gpu-memory-utilization, as in vLLM < 0.21 or with "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (default: inside it, as vLLM >= 0.21 "
        "profiles them; one instance: its graphs-outside-budget flag)",
    )
    # The default since vLLM 0.21; kept so that command lines written for it still run.
    graphs.add_argument("--graphs-in-budget", action="store_true", help=argparse.SUPPRESS)
    share.add_argument(
        "--legacy-accounting",
        action="store_true",
        help="vLLM before PR #18974: memory held by others is charged to the new instance",
    )
    share.add_argument(
        "--utilization-step",
        type=float,
        default=DEFAULT_UTILIZATION_STEP,
        help=f"grid for chosen utilizations (default {DEFAULT_UTILIZATION_STEP})",
    )
    return share


def _add_profile(commands: Subparsers) -> argparse.ArgumentParser:
    profile = commands.add_parser(
        "profile",
        help="does a GPU profile fit, and the vLLM command line of each of its instances",
        description="For a profile of gpu_profiles.yaml (default: the active one) and the "
        "backends' model descriptions (model_info: / hf_config: in models.yaml): each enabled "
        "instance in start order (pinned first), its planned memory and vLLM command line, "
        "and whether they fit on the GPU together. Without gpu_profiles.yaml every backend "
        "of models.yaml is planned as one profile on the --gpu-gib GPU.",
    )
    profile.add_argument(
        "name", nargs="?", help="the profile (default: active: in gpu_profiles.yaml)"
    )
    add_config_option(profile)
    profile.add_argument(
        "--gpu-gib",
        type=float,
        help="GPU memory in GiB (default: the profile's gpu_total_gb; required without "
        "gpu_profiles.yaml)",
    )
    return profile


def _add_backend(commands: Subparsers) -> argparse.ArgumentParser:
    backend = commands.add_parser(
        "backend",
        help="a configured backend's footprint on each of its GPUs, and where it goes",
        description="For a backend of models.yaml described by model_info: / hf_config:: "
        "per GPU, weights x 1.02 / its tensor-parallel size, the KV cache (at least one "
        "request of max_model_len tokens, split over the KV heads), CUDA graphs, overhead "
        "and CUDA context; where it goes (its gpus: list, or at each start on N GPUs by its "
        "host's gpu.placement:); and whether vLLM accepts the tensor-parallel size for the "
        "model (exit 1 when not, or when it does not fit the GPU).",
    )
    add_backend_args(backend)
    add_config_option(backend)
    return backend


#: Each subcommand: its parser (every one ends with `--json`) and its handler.
_SUBCOMMANDS: tuple[tuple[Callable[[Subparsers], argparse.ArgumentParser], Handler], ...] = (
    (_add_kv, run_kv),
    (_add_context, run_context),
    (_add_gpus, run_gpus),
    (_add_share, run_share),
    (_add_profile, run_profile),
    (_add_backend, run_backend),
)


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (one of --model, --hf-config or shape flags)")
    group.add_argument("--model", help=f"catalog model: {', '.join(catalog_names())}")
    add_shape_args(group)
    group.add_argument(
        "--kv-dtype",
        default="auto",
        help="fp16, bf16, fp32, fp8, vLLM's turboquant_k8v4, turboquant_4bit_nc, "
        "turboquant_k3v4_nc, turboquant_3bit_nc, the article's tqN, tqKkVv "
        "(default auto: the model's dtype)",
    )


def _add_sizing_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-gib", type=float, required=True, help="memory per GPU in GiB")
    weights = parser.add_argument_group("weights (--weights-gib, or derived from parameters)")
    weights.add_argument("--weights-gib", type=float, help="checkpoint size in GiB")
    weights.add_argument("--params-b", type=float, help="parameters in billions")
    weights.add_argument(
        "--weight-dtype",
        help="fp32, bf16, fp16, fp8, int8, int4, awq, gptq (default: the model's dtype)",
    )
    parser.add_argument(
        "--bytes-per-token", type=int, help="KV bytes per token (instead of model flags)"
    )
    parser.add_argument(
        "--attention-heads",
        type=int,
        help="num_attention_heads, which the tensor-parallel size must divide (default: the "
        "model's; --bytes-per-token and shape flags leave it unknown)",
    )
    _add_model_args(parser)
    tunables = parser.add_argument_group("KAITO constants")
    tunables.add_argument(
        "--utilization",
        type=float,
        default=DEFAULT_UTILIZATION,
        help=f"usable fraction of GPU memory (default {DEFAULT_UTILIZATION})",
    )
    tunables.add_argument(
        "--overhead-gib", type=float, default=2.3, help="fixed overhead per GPU (default 2.3)"
    )
    tunables.add_argument(
        "--overhead-weight-fraction",
        type=float,
        default=0.0,
        help="extra overhead per GiB of weights per GPU (KAITO #2139 uses 0.05; default 0)",
    )
    tunables.add_argument(
        "--weight-expansion",
        type=float,
        default=DEFAULT_WEIGHT_EXPANSION,
        help=f"runtime weights / checkpoint size (default {DEFAULT_WEIGHT_EXPANSION})",
    )
    tunables.add_argument(
        "--alignment",
        type=int,
        default=DEFAULT_ALIGNMENT,
        help=f"round the context down to a multiple of this (default {DEFAULT_ALIGNMENT})",
    )


def _command(args: argparse.Namespace) -> str:
    return f"plan {args.plan_command}"
