"""Serve tiny random-weight models on vLLM's CPU engine under named workloads, so that
`attn-diff record` can record their attention calls.

    python tools/record/engine.py MODEL WORKLOAD     # one model under one workload
    python tools/record/engine.py --list            # what MODEL and WORKLOAD may be

Models are written here as Hugging Face `config.json` files only: `load_format="dummy"` gives
them random weights, and prompts are token ids, so nothing is downloaded and no tokenizer is
needed. Prints the generated token ids (one line per request), so that a run with and without
the recorder can be compared.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

# Small enough to serve on two cores in under a minute; each keeps the feature its family
# is known for.
MODELS = {
    # GQA: 4 query heads per KV head pair.
    "llama-gqa": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
    },
    # Gemma 2: logit soft-cap 50, sliding-window layers alternating with global ones.
    "gemma2-softcap-window": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 32,
        "sliding_window": 48,
        "hidden_activation": "gelu_pytorch_tanh",
        "torch_dtype": "bfloat16",
    },
    # Qwen2 with a sliding window on every layer, MHA (no grouping), head size 64.
    "qwen2-window": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "use_sliding_window": True,
        "sliding_window": 40,
        "max_window_layers": 0,
        "torch_dtype": "bfloat16",
    },
    # A large GQA group: 8 query heads on one KV head, f32.
    "llama-mqa-f32": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "num_hidden_layers": 1,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
    },
    # float16 with head size 64 on pages of 64: the space of Spyre-style backends (float16,
    # head sizes and pages in multiples of 64), so their adapters can replay the calls.
    "llama-f16-h64": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float16",
    },
}

# Page size per model where it is not 32 (CPU_ATTN takes multiples of 32).
BLOCK_SIZES = {"llama-f16-h64": 64}


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 500 + 1 for i in range(n)]


# Each workload: (prompts, max new tokens, engine arguments).
WORKLOADS = {
    # Prompts longer than a step's token budget: prefill split over steps, decodes mixed in.
    "chunked-prefill": (
        [_prompt(s, n) for s, n in enumerate([150, 90, 40])],
        6,
        {"max_num_batched_tokens": 64, "enable_chunked_prefill": True},
    ),
    # Requests sharing a 64-token system prompt: later ones hit the prefix cache.
    "prefix-cache": (
        [_prompt(1, 64) + _prompt(s + 10, 9 + s) for s in range(4)],
        5,
        {"enable_prefix_caching": True, "max_num_batched_tokens": 128},
    ),
    # Many short requests decoding together: batches of decodes with odd lengths.
    "many-short": (
        [_prompt(s, 3 + s % 11) for s in range(24)],
        8,
        {"max_num_seqs": 16},
    ),
    # A small cache (24 blocks of 32 tokens, split between the window and global layers of
    # a hybrid model): requests wait and are preempted and recomputed.
    "preemption": (
        [_prompt(s, 60 + 20 * s) for s in range(6)],
        24,
        {"num_gpu_blocks_override": 24, "max_num_batched_tokens": 256, "max_model_len": 320},
    ),
    # n-gram speculative decoding: prompts that repeat themselves give the drafter proposals,
    # so decode steps verify several tokens per request at once (query length 1 + drafts).
    "spec-decode": (
        [_prompt(s, 12) * 4 for s in range(4)],
        16,
        {
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            },
        },
    ),
}


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--list"] or len(argv) != 3:
        print("models:", ", ".join(MODELS))
        print("workloads:", ", ".join(WORKLOADS))
        return 0 if argv[1:2] == ["--list"] else 2
    model, workload = argv[1], argv[2]
    if model not in MODELS or workload not in WORKLOADS:
        print(f"unknown model or workload: {model} {workload}", file=sys.stderr)
        return 2
    # apply_model sends a function to the workers: vLLM serializes it only when allowed, by
    # reference, so the spawned workers must find its module.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p
    )
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts, new_tokens, engine = WORKLOADS[workload]
    engine = {"max_model_len": 1024, **engine}
    config = MODELS[model]
    with tempfile.TemporaryDirectory(prefix=f"{model}-") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        llm = LLM(
            model=d,
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype=config["torch_dtype"],
            block_size=BLOCK_SIZES.get(model, 32),
            seed=0,
            # The KV cache in bytes rather than a share of memory: a tiny model needs little,
            # and the CPU backend refuses to start where the share is not free.
            kv_cache_memory_bytes=64 << 20,
            **engine,
        )
        import realistic_weights

        llm.apply_model(realistic_weights.initialize)
        params = SamplingParams(
            max_tokens=new_tokens, temperature=0.0, detokenize=False, ignore_eos=True
        )
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
        seconds = time.perf_counter() - t0
        tokens = sum(len(p) for p in prompts) + sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"generate: {seconds:.2f} s, {tokens} tokens, {tokens / seconds:.0f} tokens/s",
              file=sys.stderr)
        for o in outs:
            print(" ".join(str(t) for t in o.outputs[0].token_ids))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
