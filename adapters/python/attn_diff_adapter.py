"""Helper for attn-diff external-backend adapters (protocol versions 1 and 2).

An adapter is a program that attn-diff starts once and talks to over its stdin and stdout,
one framed message at a time (an 8-byte little-endian length, then a safetensors payload);
see docs/external-backends.md. This module does the framing and the handshake; an adapter
subclasses :class:`Adapter` (its methods mirror attn-diff's Rust ``Backend`` trait) and calls
:func:`serve`::

    class MyBackend(Adapter):
        name = "my-backend"
        capabilities = {"head_sizes": [64, 128], "features": ["sliding_window"]}

        def new_cache(self, config, num_blocks): ...
        def write_kv(self, config, cache, key, value, slot_mapping): ...
        def forward(self, config, cache, step): ...   # -> [num_tokens, num_heads, head_size]

    if __name__ == "__main__":
        serve(MyBackend())

With protocol version 2 (what this helper speaks unless the adapter sets ``sessions =
False``), attn-diff runs a serving trace as a session: one ``new_cache``, then per step only
that step's writes and ``forward``, on the same cache object. So ``cache`` must keep what was
written until it is overwritten, and any state an adapter keeps between calls must follow
each step's block table and slot mapping.

Raise :class:`Unsupported` for a case the backend cannot run; any other exception becomes an
``error`` reply (its traceback is the message) and the adapter keeps serving. Only frames go
to stdout: :func:`serve` points file descriptor 1 (and ``sys.stdout``) at stderr, so a stray
``print`` or C-level write cannot corrupt the stream.

Needs ``numpy`` and ``safetensors``.
"""

import json
import os
import struct
import sys
import time
import traceback
from dataclasses import dataclass
from typing import List, Optional

try:
    import numpy as np
    from safetensors.numpy import load as st_load
    from safetensors.numpy import save as st_save
except ImportError as missing:  # one line that says how to get them, not a traceback
    sys.exit(
        f"attn-diff adapter: {missing.name} is missing from {sys.executable}; "
        "`cargo xtask setup` provisions numpy and safetensors in ~/.cache/attn-diff "
        "(linked as .python-env), or: python3 -m pip install numpy safetensors"
    )

PROTOCOL = "attn-diff-external"
VERSION = 1
#: The version with sessions: a cache kept across `step` messages.
SESSION_VERSION = 2
MAX_FRAME_BYTES = 1 << 32


class Unsupported(Exception):
    """Raised by an adapter for a case it cannot run; the message is the reason."""


class ProtocolError(Exception):
    """attn-diff sent something this helper cannot read."""


@dataclass
class Config:
    """The attention config of a case (JSON metadata `config`)."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: str  # "f32", "bf16" or "f16"
    scale: float  # the effective softmax scale (head_size ** -0.5 unless set)
    kind: str  # "decoder", "encoder_only" or "encoder_decoder" (cross-attention)
    sliding_window: Optional[int]
    logits_soft_cap: Optional[float]
    alibi_slopes: Optional[List[float]]
    sinks: Optional[List[float]]
    #: An FP8 KV cache, {"dtype": "fp8_e4m3" | "fp8_e5m2", "k_scale": float, "v_scale":
    #: float}: K/V stored as fp8(x / scale), read as fp8 * scale. None: the compute dtype.
    kv_cache: Optional[dict] = None

    @staticmethod
    def from_json(text: str) -> "Config":
        c = json.loads(text)
        scale = c.get("scale")
        return Config(
            num_heads=c["num_heads"],
            num_kv_heads=c["num_kv_heads"],
            head_size=c["head_size"],
            block_size=c["block_size"],
            dtype=c["dtype"],
            scale=float(scale) if scale is not None else c["head_size"] ** -0.5,
            kind=c.get("kind", "decoder"),
            sliding_window=c.get("sliding_window"),
            logits_soft_cap=c.get("logits_soft_cap"),
            alibi_slopes=c.get("alibi_slopes"),
            sinks=c.get("sinks"),
            kv_cache=c.get("kv_cache"),
        )

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def window_left_right(self):
        """(left, right) key offsets of the window around a query, or None without one.

        A window of w keys: decoder (w - 1, 0), encoder-only (w - 1, w - 1).
        """
        if self.sliding_window is None:
            return None
        left = self.sliding_window - 1
        return (left, 0) if self.kind == "decoder" else (left, left)


@dataclass
class Step:
    """One forward step, as a model runner passes it. Integer arrays are int64."""

    query: np.ndarray  # [num_tokens, num_heads, head_size] float32 (padding rows included)
    query_start_loc: np.ndarray  # [num_seqs + 1], prefix sum of query_lens
    query_lens: np.ndarray  # [num_seqs]
    seq_lens: np.ndarray  # [num_seqs], context + new tokens
    block_table: np.ndarray  # [num_seqs, max_blocks], padded with the null block 0
    slot_mapping: np.ndarray  # [num_tokens], the new tokens' slots (-1: do not write)
    num_tokens: int


class Adapter:
    """Base class of an adapter; override the three methods (and the class attributes)."""

    #: Reported in the handshake (the backend is `external:<name in attn-diff.toml>`).
    name = "adapter"
    description: Optional[str] = None
    #: Declared restrictions, see docs/external-backends.md ("capabilities"); {} = none.
    capabilities: dict = {}
    #: Whether to offer protocol version 2 (sessions: one cache across a trace's steps).
    sessions: bool = True

    def check(self, config: Config) -> None:
        """Raise Unsupported for configs the capabilities cannot express."""

    def new_cache(self, config: Config, num_blocks: int):
        raise NotImplementedError

    def write_kv(self, config: Config, cache, key, value, slot_mapping) -> None:
        """Store rows `key`/`value` [n, num_kv_heads, head_size] at `slot_mapping` [n],
        skipping slot -1 (reshape-and-cache)."""
        raise NotImplementedError

    def forward(self, config: Config, cache, step: Step):
        """Attention for every token: [num_tokens, num_heads, head_size] (numpy, or
        anything np.asarray takes). May return (output, kernel_seconds) to report its own
        timing; otherwise the time of this call is reported."""
        raise NotImplementedError


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float values to the case dtype (round-to-nearest-even), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f32":
        return x
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x), x, out)
    raise ValueError(f"unknown dtype {dtype}")


# ---- framing ---------------------------------------------------------------------------


def read_frame(stream) -> Optional[bytes]:
    """One frame's payload, or None at a clean end of stream."""
    head = stream.read(8)
    if not head:
        return None
    if len(head) < 8:
        raise ProtocolError("stream ended inside a frame length")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame length {n} is over the limit")
    payload = stream.read(n)
    if len(payload) < n:
        raise ProtocolError(f"stream ended inside a frame ({len(payload)} of {n} bytes)")
    return payload


def write_frame(stream, payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)))
    stream.write(payload)
    stream.flush()


def metadata_of(payload: bytes) -> dict:
    """The `__metadata__` of a safetensors payload."""
    (n,) = struct.unpack("<Q", payload[:8])
    header = json.loads(payload[8 : 8 + n])
    return header.get("__metadata__") or {}


def message(meta: dict, tensors: Optional[dict] = None) -> bytes:
    return st_save(tensors or {}, metadata={k: str(v) for k, v in meta.items()})


# ---- one case --------------------------------------------------------------------------


def run_case(adapter: Adapter, meta: dict, tensors: dict, session=None):
    """Apply the writes in order to a cache and run the step: (output, kernel_seconds).

    Without a session (a `case` message), the cache is new. With one (a `step` message), it
    is the session's cache: new when the step says `fresh`, else the one the last step used.
    """
    config = Config.from_json(meta["config"])
    if config.kv_cache is not None and "fp8_kv_cache" not in adapter.capabilities.get("features", []):
        raise Unsupported(f"FP8 KV cache ({config.kv_cache['dtype']}) not implemented")
    if config.kind == "encoder_decoder" and "encoder_decoder" not in adapter.capabilities.get("kinds", []):
        raise Unsupported("cross-attention (encoder_decoder) not implemented")
    adapter.check(config)
    num_writes = int(meta["num_writes"])
    num_tokens = int(meta["num_tokens"])
    if session is None or meta.get("fresh") == "1" or session.get("id") != meta.get("session"):
        if session is not None:
            session.clear()
        cache = adapter.new_cache(config, int(meta["num_blocks"]))
        if session is not None:
            session.update(id=meta.get("session"), cache=cache)
    else:
        cache = session["cache"]
    last_slots = np.full(num_tokens, -1, dtype=np.int64)
    for i in range(num_writes):
        slots = tensors[f"write.{i}.slot_mapping"].astype(np.int64)
        adapter.write_kv(
            config, cache, tensors[f"write.{i}.key"], tensors[f"write.{i}.value"], slots
        )
        last_slots = slots
    as64 = lambda name: tensors[name].astype(np.int64)  # noqa: E731
    step = Step(
        query=tensors["query"],
        query_start_loc=as64("query_start_loc"),
        query_lens=as64("query_lens"),
        seq_lens=as64("seq_lens"),
        block_table=as64("block_table"),
        slot_mapping=last_slots,
        num_tokens=num_tokens,
    )
    t0 = time.perf_counter()
    result = adapter.forward(config, cache, step)
    elapsed = time.perf_counter() - t0
    if isinstance(result, tuple):
        result, elapsed = result
    out = np.asarray(result)
    if out.dtype not in (np.float16, np.float32, np.float64):
        out = out.astype(np.float32)
    return np.ascontiguousarray(out), float(elapsed)


#: The one session an adapter keeps (a new session replaces it): {"id", "cache"}.
_SESSION: dict = {}


def answer(adapter: Adapter, payload: bytes) -> bytes:
    meta = metadata_of(payload)
    kind = meta.get("message")
    if kind == "hello":
        if meta.get("protocol") != PROTOCOL or meta.get("version") != str(VERSION):
            raise ProtocolError(f"attn-diff speaks {meta.get('protocol')} v{meta.get('version')}")
        offered = str(meta.get("versions", VERSION)).split(",")
        version = SESSION_VERSION if adapter.sessions and str(SESSION_VERSION) in offered else VERSION
        reply = {
            "message": "hello",
            "protocol": PROTOCOL,
            "version": version,
            "name": adapter.name,
            "capabilities": json.dumps(adapter.capabilities),
        }
        if adapter.description:
            reply["description"] = adapter.description
        return message(reply)
    case_id = meta.get("case_id", "")
    if kind not in ("case", "step"):
        return message({"message": "error", "case_id": case_id, "error": f"unknown message {kind!r}"})
    try:
        session = _SESSION if kind == "step" else None
        out, seconds = run_case(adapter, meta, st_load(payload), session)
    except Unsupported as u:
        _SESSION.clear()
        return message({"message": "unsupported", "case_id": case_id, "reason": str(u)})
    except Exception:  # the backend failed on this case; keep serving
        _SESSION.clear()
        return message({"message": "error", "case_id": case_id, "error": traceback.format_exc()[-4000:]})
    return message(
        {"message": "output", "case_id": case_id, "kernel_seconds": repr(seconds)},
        {"output": out},
    )


def serve(adapter: Adapter) -> None:
    """Answer attn-diff's messages until it closes stdin."""
    stdin = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    while True:
        payload = read_frame(stdin)
        if payload is None:
            return
        write_frame(out, answer(adapter, payload))
