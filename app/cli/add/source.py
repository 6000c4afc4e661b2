"""Where `microscheduler add --model` finds the model's `config.json` and the size of its
weights, without a download: a local directory, or the Hugging Face cache.

The cache is the one `huggingface_hub` uses: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`, holding `models--ORG--NAME/snapshots/REVISION/` (its
`refs/main` names the revision a download of the default branch left there).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.planner.units import GIB

CONTAINER_HF_HOME = "/root/.cache/huggingface"  # vllm/vllm-openai runs as root


@dataclass(frozen=True)
class Found:
    """A model's `config.json`, read, and the checkpoint's size when the files say."""

    config_path: Path
    config: dict[str, object]
    weights_bytes: int | None  # the safetensors index's total_size, or the files' sizes
    weights_from: str | None  # how `weights_bytes` was obtained


def hf_home(environ: Mapping[str, str]) -> Path:
    """`$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`."""
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser()
    cache = environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache).expanduser() / "huggingface"


def hub_cache(environ: Mapping[str, str]) -> Path:
    """Where `huggingface_hub` keeps downloaded repositories."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    return hf_home(environ) / "hub"


def repo_folder(repo: str) -> str:
    """`Qwen/Qwen3-8B` -> `models--Qwen--Qwen3-8B` (huggingface_hub's folder name)."""
    return "models--" + repo.replace("/", "--")


def snapshot_dirs(cache: Path, repo: str) -> list[Path]:
    """The snapshots of `repo` in `cache` holding a config.json: the one `refs/main`
    names first, then the others, newest first."""
    root = cache / repo_folder(repo)
    snapshots = root / "snapshots"
    if not snapshots.is_dir():
        return []
    found = [path for path in snapshots.iterdir() if (path / "config.json").is_file()]
    found.sort(key=lambda path: path.stat().st_mtime, reverse=True)
    main = root / "refs" / "main"
    if main.is_file():
        revision = main.read_text(encoding="utf-8").strip()
        found.sort(key=lambda path: path.name != revision)
    return found


def find_model(model: str, environ: Mapping[str, str]) -> Found | None:
    """`model` as a local directory holding config.json, else as a repository id in the
    Hugging Face cache; None when neither has a config.json. `ValueError` for a file that
    is not a JSON object."""
    local = Path(model).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"{local} is a directory without a config.json")
        return _read(local)
    for snapshot in snapshot_dirs(hub_cache(environ), model):
        return _read(snapshot)
    return None


def _read(folder: Path) -> Found:
    path = folder / "config.json"
    data = _read_file(path)
    size, how = weights_size(folder)
    return Found(config_path=path, config=data, weights_bytes=size, weights_from=how)


def weights_size(folder: Path) -> tuple[int | None, str | None]:
    """The checkpoint's bytes: `model.safetensors.index.json`'s `metadata.total_size`,
    else the sizes of the `*.safetensors` files (a cache's are links to its blobs: their
    targets' sizes); (None, None) when neither is there (only config.json downloaded)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"]
        except (ValueError, KeyError, TypeError):
            total = None
        if isinstance(total, int) and total > 0:
            return total, f"{index.name}: {total / GIB:.2f} GiB"
    files = sorted(folder.glob("*.safetensors"))
    sizes = [path.stat().st_size for path in files if path.exists()]
    if files and len(sizes) == len(files):
        total = sum(sizes)
        return total, f"{len(files)} safetensors file(s): {total / GIB:.2f} GiB"
    return None, None


def vllm_cache_root(environ: Mapping[str, str]) -> Path:
    """vLLM's cache (its torch.compile cache is `torch_compile_cache/` in it): as vLLM
    reads it, `$VLLM_CACHE_ROOT`, else `$XDG_CACHE_HOME/vllm`, else `~/.cache/vllm`
    (`vllm/envs.py:714`, `get_default_cache_root` at `vllm/envs.py:340`)."""
    if environ.get("VLLM_CACHE_ROOT"):
        return Path(environ["VLLM_CACHE_ROOT"]).expanduser()
    cache = environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache).expanduser() / "vllm"


def read_config(path: Path) -> Found:
    """`--hf-config PATH`: a config.json, or the folder holding one."""
    path = path.expanduser()
    folder = path if path.is_dir() else path.parent
    if not (folder / "config.json").is_file() and not path.is_file():
        raise ValueError(f"file not found: {path}")
    if path.is_file() and path.name != "config.json":
        found = _read_file(path)
        return Found(config_path=path, config=found, weights_bytes=None, weights_from=None)
    return _read(folder)


def _read_file(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must contain a JSON object")
    return data
