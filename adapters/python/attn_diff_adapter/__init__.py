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

The package also holds :mod:`attn_diff_adapter.testing`, a pytest helper that runs
``attn-diff check`` on an adapter or on a vLLM attention backend class and fails the test with
the shrunk report. Install it with ``pip install ./adapters/python``; run from a checkout, the
adapter scripts beside this package find it without installing.

Needs ``numpy`` and ``safetensors``.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import traceback
from dataclasses import dataclass
from typing import (
    IO,
    Any,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypedDict,
    Union,
)

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

__all__ = [
    "Adapter",
    "Capabilities",
    "CapabilityError",
    "CAPABILITY_KEYS",
    "Config",
    "ProtocolError",
    "Step",
    "Unsupported",
    "answer",
    "capabilities_inherited_from",
    "decline_reason",
    "environment_of",
    "round_to_dtype",
    "protect_stdout",
    "run_case",
    "serve",
    "validate_capabilities",
]

PROTOCOL = "attn-diff-external"
VERSION = 1
#: The version with sessions: a cache kept across `step` messages.
SESSION_VERSION = 2
MAX_FRAME_BYTES = 1 << 32

DTYPES = ("f32", "bf16", "f16")
KINDS = ("decoder", "encoder_only", "encoder_decoder")
FEATURES = (
    "sliding_window",
    "logits_soft_cap",
    "alibi",
    "sinks",
    "fp8_kv_cache",
    "padded_requests",
    "mla",
    "chunked_local_attention",
    "fp8_query",
    "chunk_lookback",
    "non_causal",
    "prefix_lm",
    "rswa",
    "kv_head_scales",
    "kv_token_scales",
)
#: The features every adapter was assumed to have before ``features`` could be omitted: a
#: later one (an FP8 cache, MLA, local chunks) is run only by an adapter that lists it.
ESTABLISHED_FEATURES = ("sliding_window", "logits_soft_cap", "alibi", "sinks")
#: How a cache holds K and V: rows per kv head (`mha`), or one latent entry whose first
#: `head_size_v` dims are V (`mla`).
KV_LAYOUTS = ("mha", "mla")
#: KV-cache dtypes as vLLM's `kv_cache_dtype` names them; "fp8" is "fp8_e4m3".
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


class Capabilities(TypedDict, total=False):
    """What an adapter declares it can run (the handshake's ``capabilities``).

    Every key is optional; a key left out, or ``None``, means "no restriction". attn-diff
    draws its cases inside the declared space (and ``check --only`` narrows it further), so
    a backend sees only what it declares; what no key can say, it declines per case by
    raising :class:`Unsupported`.

    - ``dtypes``: compute dtypes, from ``"f32"``, ``"bf16"``, ``"f16"``.
    - ``head_sizes``: the head sizes; ``head_size_multiple_of``: head sizes must be a multiple.
    - ``block_sizes``: the block sizes (tokens per KV-cache block);
      ``block_size_multiple_of``: block sizes must be a multiple.
    - ``kinds``: from ``"decoder"``, ``"encoder_only"``, ``"encoder_decoder"``
      (cross-attention is run only when listed).
    - ``features``: the optional features implemented, from ``"sliding_window"``,
      ``"logits_soft_cap"``, ``"alibi"``, ``"sinks"``, ``"fp8_kv_cache"``,
      ``"padded_requests"`` (requests of query length 0 and seq_len 0 after the real ones,
      as vLLM pads a batch's request count for CUDA graphs), ``"mla"``; a case using a
      feature not listed is not drawn. (Encoder-only and cross-attention are ``kinds``.)
      ``"mla"`` (multi-head latent attention: one latent kv head, V the first
      ``config.head_size_v`` dims of each key row, writes carry no V) only when listed.
      ``"chunked_local_attention"`` (``config.attention_chunk_size``); ``"fp8_query"``
      (``config.kv_cache["q_scale"]``: the query quantized to E4M3 with that scale before
      the kernel, saturating, and read back as ``fp8 * q_scale``, as vLLM's ``query_quant``);
      ``"chunk_lookback"`` (``config.chunk_lookback``: a query also sees the k chunks before
      its own, vLLM 0.33's ``CHUNK_LOOKBACK``); ``"non_causal"`` (``step.causal``: per
      request, whether it is causal; a non-causal decoder request sees every key of its
      sequence, a window reaching both ways, as vLLM 0.33's per-request ``causal``);
      ``"prefix_lm"`` (``step.prefix_lm_ranges``: vLLM 0.33's ``mm_req_doc_ranges``, a query
      inside a range ``[start, end]`` of its request, ends inclusive, also sees the whole
      range; with ``step.prefix_lm_clamp`` only within the sliding window, Gemma 4's
      ``MM_PREFIX_CLAMP_SW``; a range may reach past the request's ``seq_len``, as vLLM
      passes an image's whole range in chunked prefill: its keys stop at ``seq_len - 1``);
      ``"rswa"`` (``step.rswa_window`` and ``step.rswa_prefix_lens``: vLLM 0.33's R-SWA,
      keys below a request's prefix length stay visible, later ones only when
      ``p - k < rswa_window``; a prefix may pass ``seq_len``); ``"kv_head_scales"``
      (``config.kv_cache["scales"]`` of granularity ``"head"``: one K and one V scale per kv
      head, vLLM's ``use_per_head_quant_scales``, FA3's per-head descale);
      ``"kv_token_scales"`` (granularity ``"token"``: an E4M3 cache whose every written
      (token, kv head) row of K or V gets its own scale ``max(absmax / 448, 1e-6)``, vLLM's
      ``kv_cache_dtype="fp8_per_token_head"``). Both are run only when listed, and need the
      FP8 cache declared too (see :attr:`Config.kv_cache`).
    - ``max_seqs``: sequences per step; ``max_query_len``: new tokens of one sequence in a
      step; ``max_seq_len``: context plus new tokens of one sequence (for cross-attention,
      the encoder's keys); ``max_tokens``: tokens per step, padding tokens included;
      ``max_group``: query heads per KV head.
    - ``kv_cache_dtypes``: from ``"auto"`` (the cache in the compute dtype), ``"fp8_e4m3"``
      (vLLM's ``"fp8"``), ``"fp8_e5m2"``. An FP8 format listed here declares the FP8 cache by
      itself; without this key, ``"fp8_kv_cache"`` in ``features`` does.
    - ``kv_layouts``: from ``"mha"``, ``"mla"``: an MLA-only adapter lists ``["mla"]``.
    - ``batch_invariant``: ``True`` when a request's rows keep every bit whatever else its
      call holds (other requests, their order, its blocks' physical ids, a repeated call):
      attn-diff's invariance pairs then fail any bit that moves, where otherwise they only
      measure the drift. A claim about the backend, not a part of its case space.
    """

    dtypes: Optional[List[str]]
    head_sizes: Optional[List[int]]
    head_size_multiple_of: Optional[int]
    block_sizes: Optional[List[int]]
    block_size_multiple_of: Optional[int]
    kinds: Optional[List[str]]
    features: Optional[List[str]]
    max_seqs: Optional[int]
    max_query_len: Optional[int]
    max_seq_len: Optional[int]
    max_tokens: Optional[int]
    max_group: Optional[int]
    kv_cache_dtypes: Optional[List[str]]
    kv_layouts: Optional[List[str]]
    batch_invariant: Optional[bool]


#: Every capability key: "choice" lists take values from the tuple, "sizes" lists positive
#: integers, "int" is one positive integer, "bool" is true or false.
CAPABILITY_KEYS: Dict[str, Union[Tuple[str, ...], str]] = {
    "dtypes": DTYPES,
    "head_sizes": "sizes",
    "head_size_multiple_of": "int",
    "block_sizes": "sizes",
    "block_size_multiple_of": "int",
    "kinds": KINDS,
    "features": FEATURES,
    "max_seqs": "int",
    "max_query_len": "int",
    "max_seq_len": "int",
    "max_tokens": "int",
    "max_group": "int",
    "kv_cache_dtypes": KV_CACHE_DTYPES,
    "kv_layouts": KV_LAYOUTS,
    "batch_invariant": "bool",
}


class Unsupported(Exception):
    """Raised by an adapter for a case it cannot run; the message is the reason."""


class ProtocolError(Exception):
    """attn-diff sent something this helper cannot read."""


class CapabilityError(ValueError):
    """An adapter's own ``capabilities`` are malformed (an unknown key, a wrong value)."""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def validate_capabilities(capabilities: Mapping[str, Any]) -> Dict[str, Any]:
    """The capabilities as sent in the handshake, or :class:`CapabilityError` naming what is
    wrong: an unknown key (attn-diff refuses the handshake for one), a value of the wrong
    type, an unknown dtype, kind, feature or KV-cache dtype. ``None`` values are dropped
    (no restriction either way); ``"fp8"`` is sent as ``"fp8_e4m3"``."""
    if not isinstance(capabilities, Mapping):
        raise CapabilityError(f"capabilities must be a dict, not {type(capabilities).__name__}")
    out: Dict[str, Any] = {}
    for key, value in capabilities.items():
        kind = CAPABILITY_KEYS.get(key)
        if kind is None:
            known = ", ".join(CAPABILITY_KEYS)
            raise CapabilityError(f"unknown capability key {key!r} (known: {known})")
        if value is None:
            continue
        if kind == "bool":
            if not isinstance(value, bool):
                raise CapabilityError(f"{key}: {value!r} is not true or false")
            out[key] = value
            continue
        if kind == "int":
            if not _positive_int(value):
                raise CapabilityError(f"{key}: {value!r} is not a positive integer")
            out[key] = value
            continue
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise CapabilityError(f"{key}: {value!r} is not a list")
        if kind == "sizes":
            bad = [v for v in value if not _positive_int(v)]
            if bad:
                raise CapabilityError(f"{key}: {bad[0]!r} is not a positive integer")
            out[key] = [int(v) for v in value]
            continue
        assert isinstance(kind, tuple)
        bad = [v for v in value if v not in kind]
        if bad:
            raise CapabilityError(f"{key}: unknown value {bad[0]!r} (known: {', '.join(kind)})")
        if key == "kv_cache_dtypes":
            value = ["fp8_e4m3" if v == "fp8" else v for v in value]
        out[key] = list(dict.fromkeys(value))
    return out


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
    #: float}: K/V stored as fp8(x / scale) (the division in float32, nearest even,
    #: saturating), read as fp8 * scale. None: the compute dtype. Optional keys:
    #: "q_scale": float, an FP8 query (E4M3, fp8(q / q_scale) read as fp8 * q_scale);
    #: "scales": scales finer than the tensor (absent: per tensor), either
    #: {"granularity": "head", "k": [float; num_kv_heads], "v": [float; num_kv_heads]} (an
    #: element of kv head h stored as fp8(x / k[h]), read as fp8 * k[h]; V with v[h]) or
    #: {"granularity": "token"} (E4M3 only: each written (token, kv head) row x of K or V
    #: stored with its own s = max(absmax(x) / 448, 1e-6), float32 arithmetic, as
    #: fp8(x_i * (1 / s)), read as fp8 * s). With either, "k_scale" and "v_scale" are 1.0.
    kv_cache: Optional[Dict[str, Any]] = None
    #: Multi-head latent attention, {"head_size_v": int}: one latent kv head of
    #: `head_size` dims, V its first `head_size_v`; writes carry `value [n, 1, 0]` and the
    #: output is [num_tokens, num_heads, head_size_v]. None: ordinary attention.
    mla: Optional[Dict[str, Any]] = None
    #: Chunked local attention (Llama 4's ``attention_chunk_size``): a decoder query at
    #: position p sees keys from ``p - p % attention_chunk_size`` (and within the window, if
    #: any). None: no chunks.
    attention_chunk_size: Optional[int] = None
    #: Chunked attention with look-back (vLLM 0.33's ``CHUNK_LOOKBACK``): with
    #: ``attention_chunk_size`` c, a query at p sees keys from ``(p // c - k) * c``. None:
    #: its own chunk only.
    chunk_lookback: Optional[int] = None

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
            mla=c.get("mla"),
            attention_chunk_size=c.get("attention_chunk_size"),
            chunk_lookback=c.get("chunk_lookback"),
        )

    @property
    def head_size_v(self) -> int:
        """Width of V and of the output: `mla.head_size_v`, else `head_size`."""
        return int(self.mla["head_size_v"]) if self.mla is not None else self.head_size

    @property
    def kv_layout(self) -> str:
        return "mla" if self.mla is not None else "mha"

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def kv_scales(self) -> Optional[str]:
        """How fine the FP8 cache's scales are: "tensor" (``k_scale``/``v_scale`` for every
        element), "head" (one per kv head) or "token" (one per written token and kv head);
        None without an FP8 cache."""
        if self.kv_cache is None:
            return None
        scales = self.kv_cache.get("scales")
        return "tensor" if scales is None else str(scales["granularity"])

    @property
    def kv_cache_dtype(self) -> str:
        """The KV-cache dtype as the capabilities name it: "auto", "fp8_e4m3" or "fp8_e5m2"."""
        return "auto" if self.kv_cache is None else str(self.kv_cache["dtype"])

    def window_left_right(self) -> Optional[Tuple[int, int]]:
        """(left, right) key offsets of the window around a query, or None without one.

        A window of w keys: decoder (w - 1, 0), encoder-only (w - 1, w - 1).
        """
        if self.sliding_window is None:
            return None
        left = self.sliding_window - 1
        return (left, 0) if self.kind == "decoder" else (left, left)

    def features(self) -> List[str]:
        """The optional features this config uses, as the capabilities name them."""
        used = [
            ("sliding_window", self.sliding_window),
            ("logits_soft_cap", self.logits_soft_cap),
            ("alibi", self.alibi_slopes),
            ("sinks", self.sinks),
            ("fp8_kv_cache", self.kv_cache),
            ("mla", self.mla),
            ("chunked_local_attention", self.attention_chunk_size),
            ("fp8_query", (self.kv_cache or {}).get("q_scale")),
            ("chunk_lookback", self.chunk_lookback),
            ("kv_head_scales", True if self.kv_scales == "head" else None),
            ("kv_token_scales", True if self.kv_scales == "token" else None),
        ]
        return [name for name, value in used if value is not None]


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
    #: [num_seqs] bool: whether each request is causal; None: every one is (sent only to an
    #: adapter that lists the ``non_causal`` feature).
    causal: Optional[np.ndarray] = None
    #: [num_ranges, 3] rows (seq, start, end), ends inclusive: PrefixLM's bidirectional
    #: ranges; None: none (sent only to an adapter that lists ``prefix_lm``).
    prefix_lm_ranges: Optional[np.ndarray] = None
    #: Whether a range's keys are seen only within the sliding window (Gemma 4).
    prefix_lm_clamp: bool = False
    #: R-SWA's window and [num_seqs] prefix lengths; None: no R-SWA (sent only to an
    #: adapter that lists ``rswa``).
    rswa_window: Optional[int] = None
    rswa_prefix_lens: Optional[np.ndarray] = None

    def is_causal(self, seq: int) -> bool:
        return self.causal is None or bool(self.causal[seq])

    def ranges_of(self, seq: int) -> List[Tuple[int, int]]:
        """Sequence `seq`'s PrefixLM ranges (start, end), ends inclusive."""
        if self.prefix_lm_ranges is None:
            return []
        return [(int(a), int(b)) for s, a, b in self.prefix_lm_ranges if int(s) == seq]


class Adapter:
    """Base class of an adapter; override the three methods (and the class attributes).

    ``capabilities`` (a :class:`Capabilities` dict) declares the case space the backend
    runs; every key is optional and documented on :class:`Capabilities`::

        capabilities = {
            "dtypes": ["bf16", "f16"],
            "head_sizes": [64, 128],            # or "head_size_multiple_of": 32
            "block_size_multiple_of": 16,       # or "block_sizes": [16, 32]
            "kinds": ["decoder"],
            "features": ["sliding_window", "logits_soft_cap"],
            "max_seqs": 64, "max_query_len": 512, "max_seq_len": 8192,
            "max_tokens": 2048, "max_group": 8,
            "kv_cache_dtypes": ["auto", "fp8_e4m3"],
        }

    :func:`serve` checks them (:func:`validate_capabilities`) before the handshake: an
    unknown key or a malformed value stops the adapter with a one-line error on stderr.
    """

    #: Reported in the handshake (the backend is `external:<name in attn-diff.toml>`).
    name: str = "adapter"
    description: Optional[str] = None
    #: Declared restrictions (see :class:`Capabilities`); {} = none.
    capabilities: Capabilities = {}
    #: Whether to offer protocol version 2 (sessions: one cache across a trace's steps).
    sessions: bool = True
    #: Environment variables that change what the adapter runs (a plugin's path, a library's
    #: settings); a name ending in ``*`` stands for every variable with that prefix. The
    #: handshake sends those that are set, with their values: replay files record them and
    #: replay lines set them.
    environment: Sequence[str] = ()

    def check(self, config: Config) -> None:
        """Raise Unsupported for configs the capabilities cannot express."""

    def new_cache(self, config: Config, num_blocks: int) -> Any:
        """A KV cache of `num_blocks` blocks for `config` (any object `write_kv` and
        `forward` understand)."""
        raise NotImplementedError

    def write_kv(
        self,
        config: Config,
        cache: Any,
        key: np.ndarray,
        value: np.ndarray,
        slot_mapping: np.ndarray,
    ) -> None:
        """Store rows `key`/`value` [n, num_kv_heads, head_size] at `slot_mapping` [n],
        skipping slot -1 (reshape-and-cache)."""
        raise NotImplementedError

    def forward(self, config: Config, cache: Any, step: Step) -> Any:
        """Attention for every token: [num_tokens, num_heads, head_size_v] (numpy, or
        anything np.asarray takes). May return (output, kernel_seconds) to report its own
        timing; otherwise the time of this call is reported."""
        raise NotImplementedError


def round_to_dtype(x: Any, dtype: str) -> np.ndarray:
    """Round float values to the case dtype (round-to-nearest-even), returned as float32."""
    a: np.ndarray = np.asarray(x, dtype=np.float32)
    if dtype == "f32":
        return a
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = a.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(np.float32)
        rounded_out: np.ndarray = np.where(np.isnan(a), a, out)
        return rounded_out
    raise ValueError(f"unknown dtype {dtype}")


# ---- framing ---------------------------------------------------------------------------


def read_frame(stream: IO[bytes]) -> Optional[bytes]:
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


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)))
    stream.write(payload)
    stream.flush()


def metadata_of(payload: bytes) -> Dict[str, str]:
    """The `__metadata__` of a safetensors payload."""
    (n,) = struct.unpack("<Q", payload[:8])
    header = json.loads(payload[8 : 8 + n])
    meta: Dict[str, str] = header.get("__metadata__") or {}
    return meta


def message(meta: Mapping[str, Any], tensors: Optional[Dict[str, np.ndarray]] = None) -> bytes:
    return bytes(st_save(tensors or {}, metadata={k: str(v) for k, v in meta.items()}))


# ---- one case --------------------------------------------------------------------------


def decline_reason(
    capabilities: Mapping[str, Any],
    config: Config,
    seq_lens: Optional[Sequence[int]] = None,
    query_lens: Optional[Sequence[int]] = None,
    num_tokens: Optional[int] = None,
    causal: Optional[Sequence[bool]] = None,
    prefix_lm: bool = False,
    rswa: bool = False,
) -> Optional[str]:
    """Why a case lies outside `capabilities` (validated), or None when it is inside.

    attn-diff draws inside the declared space, so this is a safety net: it keeps an adapter
    from running what it did not declare whatever sends it. An FP8 cache and cross-attention
    need declaring (``kv_cache_dtypes`` or the ``fp8_kv_cache`` feature; ``kinds``)."""
    caps = capabilities

    def listed(key: str, value: Any) -> bool:
        allowed = caps.get(key)
        return allowed is None or value in allowed

    if not listed("dtypes", config.dtype):
        return f"dtype {config.dtype}: other than {', '.join(caps['dtypes'])}"
    if not listed("head_sizes", config.head_size):
        return f"head size {config.head_size}: other than {', '.join(map(str, caps['head_sizes']))}"
    m = caps.get("head_size_multiple_of")
    if m and config.head_size % m:
        return f"head size {config.head_size}: not a multiple of {m}"
    if not listed("block_sizes", config.block_size):
        return f"block size {config.block_size}: other than {', '.join(map(str, caps['block_sizes']))}"
    m = caps.get("block_size_multiple_of")
    if m and config.block_size % m:
        return f"block size {config.block_size}: not a multiple of {m}"
    if config.kind == "encoder_decoder" and "encoder_decoder" not in (caps.get("kinds") or []):
        return "cross-attention (encoder_decoder) not implemented"
    if not listed("kinds", config.kind):
        return f"{config.kind} attention not implemented"
    features = caps.get("features")
    for f in config.features():
        if f == "fp8_kv_cache":
            kv = caps.get("kv_cache_dtypes")
            declared = config.kv_cache_dtype in kv if kv is not None else "fp8_kv_cache" in (features or [])
            if not declared:
                return f"FP8 KV cache ({config.kv_cache_dtype}) not implemented"
        elif f not in ESTABLISHED_FEATURES and f not in (features or []):
            return f"{f} not implemented (not listed in the capabilities' features)"
        elif features is not None and f not in features:
            return f"{f} not implemented"
    if query_lens is not None and 0 in list(query_lens) and "padded_requests" not in (features or []):
        return "padded requests (query length 0) not implemented"
    if causal is not None and not all(causal) and "non_causal" not in (features or []):
        return "non-causal requests not implemented (not listed in the capabilities' features)"
    if prefix_lm and "prefix_lm" not in (features or []):
        return "PrefixLM ranges not implemented (not listed in the capabilities' features)"
    if rswa and "rswa" not in (features or []):
        return "R-SWA prefixes not implemented (not listed in the capabilities' features)"
    if not listed("kv_layouts", config.kv_layout):
        return f"KV layout {config.kv_layout}: other than {', '.join(caps['kv_layouts'])}"
    if config.kv_cache is None and not listed("kv_cache_dtypes", "auto"):
        return "a KV cache in the compute dtype (auto) not implemented"
    g = caps.get("max_group")
    if g and config.group_size > g:
        return f"group of {config.group_size} query heads per KV head above {g}"
    limits = [
        ("max_seqs", "sequences per step", len(seq_lens) if seq_lens is not None else None),
        ("max_query_len", "query length", max(query_lens, default=0) if query_lens is not None else None),
        ("max_seq_len", "sequence length", max(seq_lens, default=0) if seq_lens is not None else None),
        ("max_tokens", "tokens per step", num_tokens),
    ]
    for key, what, value in limits:
        limit = caps.get(key)
        if limit is not None and value is not None and value > limit:
            return f"{what} {value} above {limit}"
    return None


def run_case(
    adapter: Adapter,
    meta: Mapping[str, str],
    tensors: Dict[str, np.ndarray],
    session: Optional[Dict[str, Any]] = None,
) -> Tuple[np.ndarray, float]:
    """Apply the writes in order to a cache and run the step: (output, kernel_seconds).

    Without a session (a `case` message), the cache is new. With one (a `step` message), it
    is the session's cache: new when the step says `fresh`, else the one the last step used.
    """
    config = Config.from_json(meta["config"])
    num_writes = int(meta["num_writes"])
    num_tokens = int(meta["num_tokens"])
    caps = validate_capabilities(adapter.capabilities)
    reason = decline_reason(
        caps,
        config,
        [int(x) for x in tensors["seq_lens"]],
        [int(x) for x in tensors["query_lens"]],
        num_tokens,
        [bool(x) for x in tensors["causal"]] if "causal" in tensors else None,
        prefix_lm="prefix_lm_ranges" in tensors and len(tensors["prefix_lm_ranges"]) > 0,
        rswa="rswa_prefix_lens" in tensors,
    )
    if reason is not None:
        raise Unsupported(reason)
    adapter.check(config)
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

    def as64(name: str) -> np.ndarray:
        return tensors[name].astype(np.int64)

    step = Step(
        query=tensors["query"],
        query_start_loc=as64("query_start_loc"),
        query_lens=as64("query_lens"),
        seq_lens=as64("seq_lens"),
        block_table=as64("block_table"),
        slot_mapping=last_slots,
        num_tokens=num_tokens,
        causal=tensors["causal"].astype(bool) if "causal" in tensors else None,
        prefix_lm_ranges=as64("prefix_lm_ranges").reshape(-1, 3) if "prefix_lm_ranges" in tensors else None,
        prefix_lm_clamp="prefix_lm_clamp" in tensors and bool(tensors["prefix_lm_clamp"][0]),
        rswa_window=int(tensors["rswa_window"][0]) if "rswa_window" in tensors else None,
        rswa_prefix_lens=as64("rswa_prefix_lens") if "rswa_prefix_lens" in tensors else None,
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
_SESSION: Dict[str, Any] = {}


def answer(adapter: Adapter, payload: bytes) -> bytes:
    """The reply to one message (a `hello`, `case` or `step` frame's payload)."""
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
            "capabilities": json.dumps(validate_capabilities(adapter.capabilities)),
        }
        if adapter.description:
            reply["description"] = adapter.description
        seen = environment_of(adapter.environment)
        if seen:
            reply["environment"] = json.dumps(seen)
        inherited = capabilities_inherited_from(adapter)
        if inherited:
            reply["inherited_capabilities"] = inherited
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


def environment_of(names: Sequence[str], env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables of `names` (``PREFIX*`` for a prefix) that are set in `env` (the
    process's environment), with their values."""
    env = os.environ if env is None else env
    out: Dict[str, str] = {}
    for name in names:
        if name.endswith("*"):
            out.update({k: v for k, v in env.items() if k.startswith(name[:-1])})
        elif name in env:
            out[name] = env[name]
    return dict(sorted(out.items()))


def capabilities_inherited_from(adapter: "Adapter") -> Optional[str]:
    """The class whose ``capabilities`` `adapter` uses, when a class below it (the adapter's
    own, say) overrides how it computes (``forward``, ``new_cache``, ``write_kv``) without
    declaring capabilities of its own: it is then sent every feature the other class runs.
    None when the capabilities are the adapter's own (or set on the instance), or
    :class:`Adapter`'s defaults."""
    if "capabilities" in vars(adapter):
        return None
    mro = type(adapter).__mro__

    def owner(attr: str) -> Optional[type]:
        return next((c for c in mro if attr in vars(c)), None)

    declared = owner("capabilities")
    if declared is None or declared is Adapter:
        return None
    below = [c for c in (owner(a) for a in ("forward", "new_cache", "write_kv")) if c is not None]
    if any(mro.index(c) < mro.index(declared) for c in below):
        return f"{declared.__module__}.{declared.__qualname__}"
    return None


_PROTOCOL_OUT: Optional[IO[bytes]] = None


def protect_stdout() -> IO[bytes]:
    """The protocol's stream (the process's stdout), kept for frames only; from here on
    anything else printed to stdout, by Python or by a library's C code or logger, goes to
    stderr. Call it before importing a library that logs to stdout while it loads (vLLM 0.27
    does); `serve` calls it too, and a second call returns the same stream."""
    global _PROTOCOL_OUT
    if _PROTOCOL_OUT is None:
        sys.stdout.flush()
        _PROTOCOL_OUT = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    return _PROTOCOL_OUT


def serve(adapter: Adapter) -> None:
    """Answer attn-diff's messages until it closes stdin.

    The adapter's capabilities are checked first: a malformed declaration exits with status
    2 and one line on stderr (which attn-diff shows), before any frame is written."""
    try:
        validate_capabilities(adapter.capabilities)
    except CapabilityError as bad:
        sys.stderr.write(f"attn-diff adapter {adapter.name!r}: capabilities: {bad}\n")
        sys.stderr.flush()
        sys.exit(2)
    inherited = capabilities_inherited_from(adapter)
    if inherited:
        sys.stderr.write(
            f"attn-diff adapter {adapter.name!r}: {type(adapter).__name__} overrides how it computes "
            f"but inherits its capabilities from {inherited}: declare `capabilities` on "
            f"{type(adapter).__name__} to say what its own forward runs\n"
        )
        sys.stderr.flush()
    stdin = sys.stdin.buffer
    out = protect_stdout()
    while True:
        payload = read_frame(stdin)
        if payload is None:
            return
        write_frame(out, answer(adapter, payload))
