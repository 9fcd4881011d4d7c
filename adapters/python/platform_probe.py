"""What a backend runs when a plugin's platform picks it, found by trying the smallest cases.

vLLM's selector asks a backend's declarations (`supports_sliding_window`, `supports_sink`,
`supports_attn_type`) before it uses the backend. A platform plugin names its backend itself
(spyre-inference's `get_attn_backend_cls` returns its class for every decoder layer, and its
encoder class for encoder layers), so those declarations are never asked: what the backend
then runs is what its impl's constructor and metadata builder accept, and what its `forward`
does not assert against. With `--selection platform` the adapter's space is found that way:

- each feature (sliding window, soft-cap, ALiBi, sinks) is kept when the smallest case with it
  builds (layer, impl, cache, builder) without a refusal;
- the kinds are those the platform routes to the class (`--kinds`, default: the declared);
- `max_seqs` is 1 when one two-sequence decode step through `forward` raises an
  AssertionError (vllm-spyre's branch-head backend asserts one sequence per step), so no case
  reaches the assert.

Every refusal is a note printed by `--probe`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from attn_diff_adapter import Config, Step, Unsupported

FEATURE_CASES = (
    ("sliding_window", dict(sliding_window=4)),
    ("logits_soft_cap", dict(logits_soft_cap=30.0)),
    ("alibi", dict(alibi_slopes=[0.5, 0.25])),
    ("sinks", dict(sinks=[0.5, -0.5])),
)


def smallest_config(caps: Dict[str, Any], **changes: Any) -> Config:
    head = caps.get("head_size_multiple_of") or (caps.get("head_sizes") or [64])[0]
    block = caps.get("block_size_multiple_of") or (caps.get("block_sizes") or [16])[0]
    base: Dict[str, Any] = dict(
        num_heads=2,
        num_kv_heads=1,
        head_size=head,
        block_size=block,
        dtype=(caps.get("dtypes") or ["f16"])[0],
        scale=head**-0.5,
        kind=(caps.get("kinds") or ["decoder"])[0],
        sliding_window=None,
        logits_soft_cap=None,
        alibi_slopes=None,
        sinks=None,
    )
    base.update(changes)
    return Config(**base)


def refusal(adapter: Any, config: Config) -> Optional[str]:
    """None when the case builds; else why not."""
    try:
        adapter.check(config)
        adapter.new_cache(config, 3)
    except Unsupported as refused:
        return str(refused)
    return None


def two_sequence_step(adapter: Any, config: Config) -> Optional[str]:
    """None when `forward` runs one decode step of two sequences; else its AssertionError."""
    bs, h, d = config.block_size, config.num_heads, config.head_size
    rng = np.random.default_rng(0)

    def rows(n: int, heads: int) -> np.ndarray:
        return rng.integers(-2, 3, (n, heads, d)).astype(np.float32)

    slots = np.array([1 * bs, 2 * bs], dtype=np.int64)
    step = Step(
        query=rows(2, h),
        query_start_loc=np.array([0, 1, 2]),
        query_lens=np.array([1, 1]),
        seq_lens=np.array([1, 1]),
        block_table=np.array([[1], [2]]),
        slot_mapping=slots,
        num_tokens=2,
    )
    cache = adapter.new_cache(config, 3)
    kv_heads = config.num_kv_heads
    adapter.write_kv(config, cache, rows(2, kv_heads), rows(2, kv_heads), slots)
    try:
        adapter.forward(config, cache, step)
    except AssertionError as e:
        return f"AssertionError: {e}"
    return None


def probe(adapter: Any, caps: Dict[str, Any], notes: List[str]) -> Dict[str, Any]:
    """`caps` with the features and the step size the platform's backend really runs."""
    caps = dict(caps)
    plain = smallest_config(caps)
    why = refusal(adapter, plain)
    if why is not None:
        raise Unsupported(f"the plainest case is refused: {why}")
    features = [f for f in caps.get("features", []) if f not in dict(FEATURE_CASES)]
    for feature, change in FEATURE_CASES:
        why = refusal(adapter, smallest_config(caps, **change))
        if why is None:
            features.append(feature)
        else:
            notes.append(f"no {feature}: {why}")
    caps["features"] = features
    limit = two_sequence_step(adapter, plain)
    if limit is not None:
        caps["max_seqs"] = 1
        notes.append(f"max_seqs 1: a two-sequence step raises {limit}")
    return caps
