"""Which tensor-parallel sizes vLLM (0.33) accepts for a model, in its own words. Pure.

Two rules, both vLLM's:

1. The attention heads split evenly over the GPUs: `ModelConfig.verify_with_parallel_config`
   (vllm/config/model.py:1557-1564) refuses at start-up, before anything loads,
   "Total number of attention heads (32) must be divisible by tensor parallel size (3)."
2. The KV heads split evenly, or are replicated evenly: `ModelConfig.get_num_kv_heads`
   (vllm/config/model.py:1663-1683) gives each GPU `max(1, kv_heads // tp)` heads (a GPU
   never holds less than one: below `tp` KV heads they are replicated), and the layer that
   holds them, `QKVParallelLinear.__init__` (vllm/model_executor/layers/linear.py:1066-1071),
   divides `tp` by the KV heads when `tp >= kv_heads` (each head replicated `tp / kv_heads`
   times), else the KV heads by `tp`, with `divide` (vllm/distributed/utils.py:130-134),
   whose assertion says "8 is not divisible by 3" (vllm/distributed/utils.py:51-55). That
   one fails later, as each worker builds the model; the planner refuses it with the config.

MLA (DeepSeek's `kv_lora_rank`) has one latent per token that every GPU keeps whole
(`get_num_kv_heads` answers 1 with `use_mla`), so only rule 1 applies.

What is not known is not checked: a shape given as `model_info:` fields has no attention
heads (rule 1 is skipped), and a count of 1 is always accepted.
"""

from __future__ import annotations

from app.planner.model_info import ModelInfo

VLLM_HEADS_CHECK = "vllm/config/model.py:1557-1564, ModelConfig.verify_with_parallel_config"
VLLM_KV_CHECK = "vllm/model_executor/layers/linear.py:1066-1071, QKVParallelLinear"


def tensor_parallel_problem(model: ModelInfo, tp: int) -> str | None:
    """Why vLLM refuses `tp` GPUs for `model` (its words, then where they are); None: it
    accepts them, as far as the model's description tells."""
    heads = model.attention_heads
    if heads is not None and heads % tp != 0:
        return (
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel "
            f"size ({tp}). ({VLLM_HEADS_CHECK})"
        )
    kv_heads = model.shape.kv_heads
    if kv_heads is None or model.shape.is_mla:
        return None
    numerator, denominator = (tp, kv_heads) if tp >= kv_heads else (kv_heads, tp)
    if numerator % denominator != 0:
        return (
            f"{numerator} is not divisible by {denominator} ({VLLM_KV_CHECK}: the model's "
            f"{kv_heads} KV heads cannot be split or replicated evenly over {tp} GPUs)"
        )
    return None


def accepted_sizes(model: ModelInfo, up_to: int = 8) -> list[int]:
    """The tensor-parallel sizes from 1 to `up_to` that vLLM accepts for `model`."""
    return [tp for tp in range(1, up_to + 1) if tensor_parallel_problem(model, tp) is None]


def refusal(model: ModelInfo, tp: int, what: str) -> str | None:
    """`tensor_parallel_problem` as a sentence naming `what` (the description: "catalog
    qwen3-8b") and the sizes vLLM accepts instead; None: accepted."""
    problem = tensor_parallel_problem(model, tp)
    if problem is None:
        return None
    sizes = ", ".join(map(str, accepted_sizes(model)))
    return (
        f"tensor parallel size {tp}: vLLM refuses it for {what}: {problem}; "
        f"sizes it accepts up to 8: {sizes}"
    )


def check_tensor_parallel(model: ModelInfo, tp: int, what: str) -> None:
    """Raise ValueError (a configuration error) when vLLM refuses `tp` GPUs for `model`."""
    refused = refusal(model, tp, what)
    if refused is not None:
        raise ValueError(refused)
