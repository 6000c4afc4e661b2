"""The `--tool-call-parser` of a model's family, from its `config.json` (`model_type`,
`architectures`, the Llama 3 rope) or, without one, from its catalog name.

Only families whose parser vLLM 0.33 registers under that name are mapped
(`vllm/tool_parsers/__init__.py`, `_TOOL_PARSERS_TO_REGISTER`): `hermes` for Qwen2.5, QwQ
and Qwen3 (line 210: "Qwen2.5/QwQ/Qwen3 JSON tool calls. Aliased to `hermes`"; the
models built on them, such as DeepSeek-R1-Distill-Qwen, have their `model_type`),
`qwen3_coder` for Qwen3-Coder (line 206), `llama3_json` for Llama 3.1-3.3 (line 137),
`llama4_pythonic` for Llama 4 (line 145), `openai` for gpt-oss (line 194). Any other
family: no parser (None), and `microscheduler add` says so rather than guess: vLLM refuses
to start with a name it does not register.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolParser:
    name: str
    family: str  # what it was chosen for, for the printed line


_QWEN = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})

#: Catalog models (`app/planner/catalog.py`) by the `model_type` of their config.json,
#: for a model planned from the catalog alone (no config.json at hand).
CATALOG_CONFIG: Mapping[str, Mapping[str, object]] = {
    "qwen3-8b": {"model_type": "qwen3"},
    "qwen3-32b": {"model_type": "qwen3"},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe"},
    "deepseek-r1-distill-qwen-14b": {"model_type": "qwen2"},
    "llama-3.1-8b": {"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}},
    "llama-3.1-70b": {"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}},
}


def tool_parser(config: Mapping[str, object], repo: str) -> ToolParser | None:
    """The parser for a model whose config.json is `config` (`repo`: its name, which
    tells Qwen3-Coder from Qwen3); None for a family not mapped here."""
    model_type = str(config.get("model_type") or "").lower()
    if model_type in _QWEN:
        if "coder" in repo.lower() and model_type.startswith("qwen3"):
            return ToolParser("qwen3_coder", "Qwen3-Coder")
        return ToolParser("hermes", f"Qwen ({model_type})")
    if model_type == "llama" and _llama3_rope(config):
        return ToolParser("llama3_json", "Llama 3.1-3.3")
    if model_type == "llama4":
        return ToolParser("llama4_pythonic", "Llama 4")
    if model_type == "gpt_oss":
        return ToolParser("openai", "gpt-oss")
    return None


def _llama3_rope(config: Mapping[str, object]) -> bool:
    """Llama 3.1 and later carry `rope_scaling.rope_type: llama3` (Llama 2 and 3.0 do not)."""
    rope = config.get("rope_scaling")
    return isinstance(rope, Mapping) and rope.get("rope_type") == "llama3"


def family_text(config: Mapping[str, object]) -> str:
    """How the family was read, for the line that says no parser was chosen."""
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    parts = [f"model_type {model_type!r}" if model_type else "no model_type"]
    if isinstance(architectures, list) and architectures:
        parts.append(f"architectures {', '.join(str(a) for a in architectures)}")
    return ", ".join(parts)
