#!/usr/bin/env python3
"""A Hugging Face checkpoint of a published model's shape with random weights, saved the way the
hub ships it (bf16 safetensors shards + index, config.json), for fine-tuning benchmarks and the
full-size import checks (no model weights can be downloaded here).

    python3 bench/hf_random_model.py --shape llama3.1-8b --out /tmp/llama31-8b
    python3 bench/hf_random_model.py --shape qwen2.5-7b --out /tmp/qwen25-7b --layers 4

The weights are transformers' own initialization (normal(0, initializer_range)), drawn on the GPU
when there is one (seconds for 8B) from --seed. An existing --out with the same config.json is
kept (the script prints "kept").
"""
import argparse
import json
import os
import sys

import torch
import transformers

SHAPES = {
    # config.json fields of the published models (meta-llama/Llama-3.1-8B, Llama-3.2-3B, Qwen/Qwen2.5-7B)
    "llama3.1-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=128000, eos_token_id=128001,
        rope=dict(rope_theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192))),
    "llama3.2-3b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=128000, eos_token_id=128001,
        rope=dict(rope_theta=500000.0, rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192))),
    "qwen2.5-7b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=False,
        use_sliding_window=False, bos_token_id=151643, eos_token_id=151643, rope=dict(rope_theta=1000000.0))),
}


def make_config(shape, layers):
    cfg_cls, _, kw = SHAPES[shape]
    kw = dict(kw)
    rope = kw.pop("rope")
    if layers:
        kw["num_hidden_layers"] = layers
    cls = getattr(transformers, cfg_cls)
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    try:  # transformers 5: rope_parameters holds theta and the scaling
        return cls(rope_parameters=dict(rope, **({} if scaling else {"rope_type": "default"})), **kw)
    except TypeError:
        return cls(rope_theta=rope["rope_theta"], rope_scaling=scaling or None, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=0, help="fewer layers than the published model (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-shard-size", default="5GB")
    a = p.parse_args()
    cfg = make_config(a.shape, a.layers)
    cfg_path = os.path.join(a.out, "config.json")
    want = cfg.to_diff_dict()
    if os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            have = json.load(f)
        if all(have.get(k) == v for k, v in want.items() if k not in ("transformers_version", "dtype", "torch_dtype")):
            print(f"kept {a.out} ({a.shape})")
            return 0
    torch.manual_seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model_cls = getattr(transformers, SHAPES[a.shape][1])
    with torch.device(dev):
        torch.set_default_dtype(torch.bfloat16)
        model = model_cls(cfg)
        torch.set_default_dtype(torch.float32)
    n = sum(t.numel() for t in model.parameters())
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size=a.max_shard_size)
    print(f"wrote {a.out}: {a.shape}, {n / 1e9:.2f} B parameters in bf16 ({model_cls.__name__}, {dev} init)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
