"""Record a running vLLM's attention calls, values and all, for `attn-diff check --recording`.

Loaded in every engine process as a vLLM general plugin (the `vllm.general_plugins` entry
point of this package, or the one `attn-diff record` puts on PYTHONPATH for a checkout); it
does nothing unless `ATTN_DIFF_RECORD` names a folder. There it wraps the attention impl of
every `Attention` layer the engine builds, whatever backend the engine selected:

- every K/V write (`do_kv_cache_update`, or the forward itself for a backend whose forward
  writes the cache) is mirrored per layer and slot, so a recorded call holds the K/V its
  context blocks held before the call, whatever the cache's layout or its blocks' age
  (prefix-cache hits, chunked prefill, preemption);
- a sampled `forward` is written as one call file: the step as an attn-diff case (config,
  lengths, block table and slot mapping with the call's blocks renumbered 1..n, sharing
  kept, queries, new and context K/V as f32) and the output the engine's backend returned.

Files are written whole or not at all (a temporary name, then a rename), so a killed engine
leaves complete calls. Each process also keeps `engine-PID.json`: the vLLM version, the
backend, the model, and how many calls it recorded and left out, with the reason of each.

Sampling, by environment: `ATTN_DIFF_RECORD_LAYERS` (comma-separated layer indices, default
every layer), `ATTN_DIFF_RECORD_EVERY` (every n-th call of a layer, default 1),
`ATTN_DIFF_RECORD_MAX_CALLS` (per process, default 2000), `ATTN_DIFF_RECORD_MAX_TOKENS`
(calls with more tokens are left out, default 4096).
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any

ENV_DIR = "ATTN_DIFF_RECORD"
SCHEMA = "attn-diff-engine-call/1"

_installed = False
_lock = threading.Lock()


def register() -> None:
    """The plugin's entry point: install the recorder when `ATTN_DIFF_RECORD` is set."""
    global _installed
    out = os.environ.get(ENV_DIR)
    if not out or _installed:
        return
    _installed = True
    attention = _attention_class()
    if attention is None:
        _Recorder.get(out).note_skip("this vLLM has no Attention layer class the recorder knows")
        return
    original_init = attention.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _Recorder.get(out).wrap(self)

    attention.__init__ = init


def _attention_class() -> Any:
    for module, name in (
        ("vllm.model_executor.layers.attention.attention", "Attention"),
        ("vllm.attention.layer", "Attention"),
    ):
        try:
            mod = __import__(module, fromlist=[name])
            return getattr(mod, name)
        except (ImportError, AttributeError):
            continue
    return None


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _layer_index(name: str) -> int | None:
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


class _Mirror:
    """What one layer's cache holds, per slot: the K and V rows last written there. Each
    write is kept whole (one copy, no per-token work); a slot points at its latest row.
    Memory grows with the tokens written, which a recording's small models keep small."""

    def __init__(self) -> None:
        self.chunks: list[tuple[Any, Any]] = []
        self.rows: dict[int, tuple[int, int]] = {}

    def write(self, key: Any, value: Any, slot_mapping: Any) -> None:
        slots = slot_mapping.tolist()
        n = min(len(slots), key.shape[0])
        chunk = len(self.chunks)
        self.chunks.append(
            (key[:n].detach().float().cpu().clone(), value[:n].detach().float().cpu().clone())
        )
        for i, s in enumerate(slots[:n]):
            if s >= 0:
                self.rows[s] = (chunk, i)

    def get(self, slot: int) -> tuple[Any, Any] | None:
        """The K and V rows at `slot`, or None where nothing was written."""
        at = self.rows.get(slot)
        if at is None:
            return None
        k, v = self.chunks[at[0]]
        return k[at[1]], v[at[1]]


class _Recorder:
    _instances: dict[str, "_Recorder"] = {}

    @classmethod
    def get(cls, out: str) -> "_Recorder":
        with _lock:
            if out not in cls._instances:
                cls._instances[out] = _Recorder(out)
            return cls._instances[out]

    def __init__(self, out: str) -> None:
        self.out = out
        self.calls_dir = os.path.join(out, "calls")
        os.makedirs(self.calls_dir, exist_ok=True)
        self.pid = os.getpid()
        self.layers = {
            int(x) for x in os.environ.get("ATTN_DIFF_RECORD_LAYERS", "").split(",") if x.strip()
        }
        self.every = max(1, _env_int("ATTN_DIFF_RECORD_EVERY", 1))
        self.max_calls = _env_int("ATTN_DIFF_RECORD_MAX_CALLS", 2000)
        self.max_tokens = _env_int("ATTN_DIFF_RECORD_MAX_TOKENS", 4096)
        self.mirrors: dict[str, _Mirror] = {}
        self.seen: dict[str, int] = {}
        self.recorded = 0
        self.skipped: dict[str, int] = {}
        self.backends: set[str] = set()
        self.model: dict[str, Any] = {}
        self._write_manifest()

    # -- the engine's side ------------------------------------------------------------------

    def wrap(self, layer: Any) -> None:
        impl = getattr(layer, "impl", None)
        name = getattr(layer, "layer_name", None)
        if impl is None or name is None:
            self.note_skip("an Attention layer without impl or layer_name")
            return
        self.backends.add(type(impl).__name__)
        self.model = self.model or _model_of()
        mirror = self.mirrors.setdefault(name, _Mirror())
        forward = impl.forward
        update = getattr(impl, "do_kv_cache_update", None)
        backend = getattr(layer, "attn_backend", None)
        writes_in_forward = update is None or bool(
            getattr(backend, "forward_includes_kv_cache_update", False)
        )

        if update is not None:

            def do_kv_cache_update(lyr: Any, key: Any, value: Any, kv_cache: Any, slots: Any) -> Any:
                mirror.write(key, value, slots)
                return update(lyr, key, value, kv_cache, slots)

            impl.do_kv_cache_update = do_kv_cache_update

        def recorded_forward(lyr: Any, query: Any, key: Any, value: Any, kv_cache: Any,
                             attn_metadata: Any, *args: Any, **kwargs: Any) -> Any:
            if attn_metadata is None:  # warm-up and profiling runs
                return forward(lyr, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
            if writes_in_forward and key is not None:
                mirror.write(key, value, attn_metadata.slot_mapping)
            call = self.seen.get(name, 0)
            self.seen[name] = call + 1
            sampled = self._sampled(name, call)
            result = forward(lyr, query, key, value, kv_cache, attn_metadata, *args, **kwargs)
            if sampled:
                out = kwargs.get("output", args[0] if args else None)
                if out is None:
                    out = result
                try:
                    self._record(name, call, impl, query, key, value, kv_cache, attn_metadata,
                                 out, mirror)
                except _LeftOut as e:
                    self.note_skip(str(e))
            return result

        impl.forward = recorded_forward

    def _sampled(self, name: str, call: int) -> bool:
        index = _layer_index(name)
        if self.layers and index not in self.layers:
            return False
        return call % self.every == 0 and self.recorded < self.max_calls

    # -- one call -----------------------------------------------------------------------------

    def _record(self, name: str, call: int, impl: Any, query: Any, key: Any, value: Any,
                kv_cache: Any, md: Any, output: Any, mirror: _Mirror) -> None:
        case = _case_of(impl, query, key, value, kv_cache, md, mirror, self.max_tokens)
        real = sum(case["batch"]["query_lens"])
        heads = case["config"]["num_heads"]
        out = output[:real].detach().float().cpu().reshape(real, heads, -1)
        doc = {
            "schema": SCHEMA,
            "layer": name,
            "call": call,
            "engine": {
                "backend": type(impl).__name__,
                "vllm": _vllm_version(),
                "pid": self.pid,
            },
            "case": case,
            "output": out.reshape(-1).tolist(),
        }
        stem = f"{self.pid}-{re.sub(r'[^A-Za-z0-9]+', '_', name)}-{call:06d}"
        _write_atomic(os.path.join(self.calls_dir, stem + ".json"), json.dumps(doc))
        self.recorded += 1
        self._write_manifest()

    def note_skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self._write_manifest()

    def _write_manifest(self) -> None:
        doc = {
            "schema": "attn-diff-engine/1",
            "pid": self.pid,
            "vllm": _vllm_version(),
            "backends": sorted(self.backends),
            "model": self.model,
            "recorded": self.recorded,
            "left_out": self.skipped,
            "sampling": {
                "layers": sorted(self.layers),
                "every": self.every,
                "max_calls": self.max_calls,
                "max_tokens": self.max_tokens,
            },
        }
        _write_atomic(os.path.join(self.out, f"engine-{self.pid}.json"), json.dumps(doc, indent=1))


class _LeftOut(Exception):
    """A call the recorder cannot write as a case: the reason goes to the manifest."""


def _case_of(impl: Any, query: Any, key: Any, value: Any, kv_cache: Any, md: Any,
             mirror: _Mirror, max_tokens: int) -> dict[str, Any]:
    """The call as an attn-diff case (the JSON `Case` of the reference crate): the new
    tokens' K/V as the forward was given them, the context's as the mirror saw it written."""
    import torch

    attn_type = getattr(impl, "attn_type", "decoder")
    attn_type = str(getattr(attn_type, "value", attn_type))  # an enum in newer vLLMs
    kinds = {"decoder": "decoder", "encoder_only": "encoder_only"}
    if attn_type not in kinds:
        raise _LeftOut(f"attention type {attn_type} (recorded: decoder, encoder_only)")
    if str(getattr(impl, "kv_cache_dtype", "auto")) not in ("auto", "bfloat16", "float16", "float32"):
        raise _LeftOut(f"KV-cache dtype {impl.kv_cache_dtype} (recorded: the model's dtype)")
    dtypes = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
    if query.dtype not in dtypes:
        raise _LeftOut(f"query dtype {query.dtype}")
    heads, kv_heads, d = int(impl.num_heads), int(impl.num_kv_heads), int(impl.head_size)
    starts = [int(x) for x in md.query_start_loc.tolist()]
    seq_lens = [int(x) for x in md.seq_lens.tolist()][: len(starts) - 1]
    query_lens = [b - a for a, b in zip(starts, starts[1:])]
    real = starts[-1]
    actual = int(getattr(md, "num_actual_tokens", real))
    if actual != real:
        raise _LeftOut("num_actual_tokens differs from the query start locations' last entry")
    total = int(query.shape[0])
    if total > max_tokens:
        raise _LeftOut(f"more than ATTN_DIFF_RECORD_MAX_TOKENS ({max_tokens}) tokens")
    block_size = _block_size(kv_cache, kv_heads, d)
    window = _window(getattr(impl, "sliding_window", None))
    table = md.block_table.tolist()
    # The lowest key each sequence's queries can see: below it, a sliding-window layer's
    # blocks are freed and reused while the block table keeps their stale ids.
    lowest = [
        max(0, length - q - window + 1) if window and attn_type == "decoder" else 0
        for length, q in zip(seq_lens, query_lens)
    ]
    # The call's blocks renumbered 1..n in order of first use; blocks two sequences share
    # stay shared. A block wholly below what its sequence can see becomes the null block 0,
    # as vLLM means it: never read (its stale id may name a block reused since).
    renumber: dict[int, int] = {}
    rows = []
    for s, length in enumerate(seq_lens):
        used = -(-length // block_size)
        physical = [int(b) for b in table[s][:used]]
        if len(physical) < used:
            raise _LeftOut("a block table row shorter than its sequence")
        rows.append(
            [
                0 if (i + 1) * block_size <= lowest[s] else renumber.setdefault(b, len(renumber) + 1)
                for i, b in enumerate(physical)
            ]
        )
    width = max((len(r) for r in rows), default=0)
    block_table = [r + [0] * (width - len(r)) for r in rows]
    engine_slots = [int(x) for x in md.slot_mapping.tolist()]
    slot_mapping: list[int] = []
    context_key: list[list[float]] = []
    context_value: list[list[float]] = []
    for s, length in enumerate(seq_lens):
        ctx = length - query_lens[s]
        for j in range(query_lens[s]):
            p = ctx + j
            physical = int(table[s][p // block_size])
            if engine_slots[starts[s] + j] != physical * block_size + p % block_size:
                raise _LeftOut("a slot mapping entry off its block table position")
            slot_mapping.append(rows[s][p // block_size] * block_size + p % block_size)
        ks, vs = [], []
        for p in range(ctx):
            slot = int(table[s][p // block_size]) * block_size + p % block_size
            written = mirror.get(slot)
            if written is None and p < lowest[s]:
                # Never read: what the freed slot holds does not matter.
                written = (torch.zeros(kv_heads, d), torch.zeros(kv_heads, d))
            if written is None:
                raise _LeftOut("a context slot the recorder never saw written")
            ks.append(written[0])
            vs.append(written[1])
        context_key.append(torch.stack(ks).reshape(-1).tolist() if ks else [])
        context_value.append(torch.stack(vs).reshape(-1).tolist() if vs else [])
    slot_mapping += [-1] * (total - real)
    if key is None or value is None:
        # KV sharing: the layer reads another layer's cache and is given no K/V of its own.
        raise _LeftOut("a layer given no K/V (it shares another layer's cache)")
    key = key[:total].detach().float().cpu().reshape(total, kv_heads, d)
    value = value[:total].detach().float().cpu().reshape(total, kv_heads, -1)
    config: dict[str, Any] = {
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_size": d,
        "block_size": block_size,
        "dtype": dtypes[query.dtype],
        "scale": float(impl.scale),
        "kind": kinds[attn_type],
        "sliding_window": window,
        "logits_soft_cap": (float(impl.logits_soft_cap) or None)
        if getattr(impl, "logits_soft_cap", None) is not None else None,
        "alibi_slopes": _floats(getattr(impl, "alibi_slopes", None)),
        "sinks": _floats(getattr(impl, "sinks", None)),
    }
    batch: dict[str, Any] = {
        "seq_lens": seq_lens,
        "query_lens": query_lens,
        "num_padding_tokens": total - real,
    }
    causal = getattr(md, "dynamic_causal", None)
    if causal is not None:
        batch["causal"] = [bool(x) for x in causal.tolist()][: len(seq_lens)]
    elif getattr(md, "causal", True) is False and attn_type == "decoder":
        batch["causal"] = [False] * len(seq_lens)
    return {
        "config": config,
        "batch": batch,
        "layout": {
            "num_blocks": len(renumber) + 1,
            "block_table": block_table,
            "slot_mapping": slot_mapping,
        },
        "tensors": {
            "query": query[:total].detach().float().cpu().reshape(-1).tolist(),
            "key": key.reshape(-1).tolist(),
            "value": value.reshape(-1).tolist(),
            "context_key": context_key,
            "context_value": context_value,
        },
    }


def _block_size(kv_cache: Any, kv_heads: int, d: int) -> int:
    """The block size of a cache in the layouts the recorder knows: CPU_ATTN's
    `[blocks, kv_heads, block_size, 2 * head_size]` and FlashAttention's
    `[2, blocks, block_size, kv_heads, head_size]`."""
    shape = tuple(int(x) for x in kv_cache.shape)
    if len(shape) == 4 and shape[1] == kv_heads and shape[3] == 2 * d:
        return shape[2]
    if len(shape) == 5 and shape[0] == 2 and shape[3] == kv_heads:
        return shape[2]
    raise _LeftOut(f"a KV cache of shape {list(shape)} (known: CPU_ATTN's and FlashAttention's)")


def _window(w: Any) -> int | None:
    """vLLM keeps a window as its size (CPU_ATTN, -1: none) or as (left, right) = (w - 1, 0)."""
    if w is None:
        return None
    if isinstance(w, (tuple, list)):
        left, right = int(w[0]), int(w[1])
        if left < 0:
            return None
        if right != 0:
            raise _LeftOut(f"a two-sided window {tuple(w)} on a decoder")
        return left + 1
    return None if int(w) <= 0 else int(w)


def _floats(t: Any) -> list[float] | None:
    if t is None:
        return None
    return [float(x) for x in (t.tolist() if hasattr(t, "tolist") else t)]


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # noqa: BLE001 - a version is a label, never a reason to fail
        return "unknown"


def _model_of() -> dict[str, Any]:
    """The served model as vLLM's current config says it (architecture, dtype, path)."""
    try:
        from vllm.config import get_current_vllm_config

        mc = get_current_vllm_config().model_config
        hf = getattr(mc, "hf_config", None)
        return {
            "model": str(getattr(mc, "model", "")),
            "architectures": list(getattr(hf, "architectures", None) or []),
            "dtype": str(getattr(mc, "dtype", "")),
        }
    except Exception:  # noqa: BLE001 - the model's name is a label
        return {}


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
