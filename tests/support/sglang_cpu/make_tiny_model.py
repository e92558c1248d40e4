"""Make the live tests' tiny model on the spot, no hub: `python make_tiny_model.py DIR` (run by the live SGLang
virtualenv's Python; test support for tests/support/live_sglang.py only).

A 2-layer Llama with random bf16 weights (hidden 64, 4 heads, 2 KV heads, context 4096) and a byte-level BPE
tokenizer trained here on a few lines of text, with a trivial chat template: a couple of hundred KB in seconds.
The text it generates is gibberish; the live tests drive SGLang's memory management, not its answers. The seed
is fixed, so every run makes the same model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 332
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "a kv cache holds the keys and values of every token a request has seen",
    "out of memory: try to lower the batch size or raise the memory fraction",
] * 50


def main(directory: str) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=VOCAB_SIZE, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, pad_token_id=3,
        torch_dtype="bfloat16",
    )  # fmt: skip
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))  # noqa: S106 - a token, not a password
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TEXT, trainer=trainer)
    special = dict(
        zip(("bos_token", "eos_token", "unk_token", "pad_token"), ("<s>", "</s>", "<unk>", "<pad>"), strict=True)
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
