"""Write a tiny random Llama that ``vllm serve`` can load, with nothing downloaded.

Run with the vLLM environment's Python (it has torch, transformers and tokenizers):
``.venv-vllm/bin/python tests/vllm_server/write_tiny_llama.py OUT_DIR``. Writes ``config.json``,
random ``model.safetensors`` (seeded), and a word-level tokenizer of the same vocabulary
(``<unk>``, ``<s>``, ``</s>``, then ``w3`` … ``w999``: the text ``"w5 w6 w7"`` is exactly three tokens,
so text prompts of a given length are easy to make and check).

The dimensions are those of ``../shared/reference/vllm-cpu-runs`` (hidden 256, intermediate 688,
4 layers, 4 heads, 4 KV heads, head_dim 64, vocab 1000, fp32), so the served model is the
one cbsim's reference CPU runs used.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 1000
MAX_LEN = 2048
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": VOCAB,
    "max_position_embeddings": MAX_LEN,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": MAX_LEN, "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))


def write_weights(out: Path, seed: int = 0) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1))  # exactly the dimensions above
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: write_tiny_llama.py OUT_DIR")
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    write_weights(out)
    write_tokenizer(out)


if __name__ == "__main__":
    main(sys.argv[1:])
