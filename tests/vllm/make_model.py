"""Writes a tiny Llama model folder that a real vLLM serves with `--load-format dummy`
(random weights, nothing downloaded): `config.json`, a byte-level BPE tokenizer trained
here and a `tokenizer_config.json` with a chat template. No weights.

Run with the real vLLM's interpreter (it has `tokenizers`):
    VENV/bin/python tests/vllm/make_model.py DIR

Sizes: the CPU attention backend needs a head size of at least 32, hence 4 heads of 32
over a hidden size of 128; 2 KV heads; 2 layers. `max_position_embeddings` 32768 so that
a test can ask for more than the model allows (`--max-model-len 65536` fails) and still
serve a Claude-Code-sized context.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 2000
# A chat template in the usual ChatML form: enough for /v1/chat/completions, /v1/messages
# (vLLM renders Anthropic messages through it) and /v1/responses.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus() -> list[str]:
    """English and code: the docstrings and source of a few standard-library modules (the
    same on every machine with this Python), so that common words are single tokens."""
    import argparse
    import inspect
    import json as json_module
    import logging

    return [inspect.getsource(m) for m in (argparse, json_module, logging)]


def tokenizer(folder: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 32768,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t, "special": True, "lstrip": False, "rstrip": False,
                "normalized": False, "single_word": False,
            }
            for t in SPECIAL
        },
    }  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return int(tok.get_vocab_size())


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer(folder)
    eos = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in eos}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 32768,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": ids["<|im_end|>"], "bos_token_id": ids["<|endoftext|>"]})
    )
    print(folder)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
