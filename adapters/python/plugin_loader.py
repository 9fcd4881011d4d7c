"""Loading a plugin's attention backend from its source, unchanged, with no device behind it.

A vLLM platform plugin (spyre-inference, vllm-spyre's `vllm_spyre_next`, the next accelerator)
keeps its attention backend in a package that is not installed here and whose device runtime
does not exist on this machine. `load_file` imports the backend's file as the plugin would:

- **Inside its source tree.** When the file sits in a package (its folder has an
  `__init__.py`), the file is imported under its dotted name from that tree, so its imports of
  sibling modules (`from spyre_inference.v1.attention.backends.spyre_attn import ...`) work.
  The top package's `__init__` is not run: it is the plugin's registration entry, which reads
  the installed distribution's metadata. A sub-package whose `__init__` cannot be imported here
  (it needs the device runtime, say) becomes an empty package, and the notes say so.
- **Alone.** A file outside any package is imported by itself; a device helper module it
  imports and that is not installed is provided by the stand-in (below).
- **The device stand-in** (`spyre`, chosen when the source imports a `custom_ops.utils` module
  or names the `spyre` device): `convert(t, device, dtype)` becomes a dtype cast on the CPU (a
  move to the `spyre` device is dropped, any other device is honoured); `torch.device("spyre")`
  can be built (no device behind it: a tensor moved there fails loudly); and `torch.compile`
  inside the plugin's modules returns the function itself, so its kernels run eagerly on CPU
  kernels (Inductor's CPU code generation is not what the device runs, and fails on some of
  these kernels). Nothing of the plugin's files is edited: the stand-ins are module attributes
  set after each module is executed.

What is then tested is the plugin's Python and its PyTorch ops in the model dtype on CPU
kernels: masks, gathers, padding, tiling, the write path and rounding of every intermediate it
keeps in that dtype; what the device's compiler and hardware do with those ops is not.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any, Callable, List, Optional, Sequence, Tuple

#: Device stand-ins by name; `auto` picks one from the source.
STAND_INS = ("auto", "spyre", "none")


def cpu_convert(tensor: Any, device: Any = None, dtype: Any = None) -> Any:
    """A plugin's `convert` (device transfer and dtype cast) with no device: the cast only.

    A move to a `spyre` device is dropped, so the tensor stays on the CPU; a move to any other
    device is done."""
    import torch

    if tensor is None:
        return None
    if dtype is not None:
        tensor = tensor.to(dtype=dtype)
    if device is not None and torch.device(device).type != "spyre":
        tensor = tensor.to(device=device)
    return tensor


class EagerTorch(types.ModuleType):
    """`torch` as a plugin module sees it under the stand-in: torch itself, except that
    `torch.compile(fn, ...)` is `fn` (and `@torch.compile(...)` leaves the function as it is)."""

    def __init__(self) -> None:
        super().__init__("torch")

    @staticmethod
    def compile(fn: Any = None, **kwargs: Any) -> Any:
        if fn is None:
            return lambda f: f
        return fn

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)


class Loaded:
    """A loaded module and what was stood in to load it."""

    def __init__(self, module: types.ModuleType, notes: List[str]) -> None:
        self.module = module
        self.notes = notes


def package_root(path: str) -> Tuple[Optional[str], Optional[str]]:
    """(the folder holding the top package, the file's dotted name), or (None, None) when the
    file is not inside a package.

    The top package is the highest folder with an `__init__.py` reached from the file through
    folders named like Python identifiers: folders between without one are namespace packages
    (spyre-inference's `v1/attention/backends/` has none)."""
    folder = os.path.dirname(os.path.abspath(path))
    chain: List[str] = []
    top_index = -1
    for _ in range(MAX_PACKAGE_DEPTH):
        name = os.path.basename(folder)
        if not name.isidentifier():
            break
        chain.insert(0, name)
        if os.path.isfile(os.path.join(folder, "__init__.py")):
            top_index = len(chain)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if top_index < 0:
        return None, None
    # chain[0] is the highest folder walked; the top package is top_index levels up.
    parts = chain[len(chain) - top_index :]
    root = os.path.dirname(os.path.abspath(path))
    for _ in parts:
        root = os.path.dirname(root)
    stem = os.path.splitext(os.path.basename(path))[0]
    return root, ".".join(parts + [stem])


#: How many folders up the search for a file's top package goes.
MAX_PACKAGE_DEPTH = 12


def imported_names(source: str) -> List[Tuple[str, List[str]]]:
    """Every `from X import a, b` of a source, as (X, [a, b]); `import X` as (X, [])."""
    found: List[Tuple[str, List[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
    return found


def choose_stand_in(source: str, requested: str) -> str:
    if requested != "auto":
        return requested
    modules = [m for m, _ in imported_names(source)]
    if any(m.endswith("custom_ops.utils") or m.startswith("torch_spyre") for m in modules):
        return "spyre"
    if '"spyre"' in source or "'spyre'" in source:
        return "spyre"
    return "none"


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class StandIn:
    """What the `spyre` stand-in does to each module of the plugin once it has run."""

    def __init__(self, kind: str, notes: List[str]) -> None:
        self.kind = kind
        self.notes = notes
        self.registered_device = False

    def before(self, source: str) -> None:
        if self.kind != "spyre" or self.registered_device:
            return
        import torch

        self.registered_device = True
        try:
            torch.device("spyre")
        except RuntimeError:
            torch.utils.rename_privateuse1_backend("spyre")
            self.notes.append("device name 'spyre' registered with no device behind it")

    def after(self, module: types.ModuleType, source: str) -> None:
        if self.kind != "spyre":
            return
        name = module.__name__
        if name.endswith("custom_ops.utils") and callable(getattr(module, "convert", None)):
            module.convert = cpu_convert  # type: ignore[attr-defined]
            self.notes.append(f"{name}.convert -> a dtype cast on the CPU")
        elif "convert" in vars(module) and any(
            m.endswith("custom_ops.utils") and "convert" in names
            for m, names in imported_names(source)
        ):
            module.convert = cpu_convert  # type: ignore[attr-defined]
        if "torch.compile" in source and isinstance(vars(module).get("torch"), types.ModuleType):
            module.torch = EagerTorch()  # type: ignore[attr-defined]
            self.notes.append(f"{name}: torch.compile -> the function itself (eager)")

    def provide_missing(self, source: str) -> None:
        """Device helper modules a lone file imports and that are not installed."""
        if self.kind != "spyre":
            return
        for module_name, names in imported_names(source):
            if not module_name.endswith("custom_ops.utils") or "convert" not in names:
                continue
            if installed(module_name):
                continue
            parts = module_name.split(".")
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                if name not in sys.modules:
                    package = types.ModuleType(name)
                    package.__path__ = []  # a package, for the next import level
                    sys.modules[name] = package
            sys.modules[module_name].convert = cpu_convert  # type: ignore[attr-defined]
            self.notes.append(f"{module_name} provided: convert is a dtype cast on the CPU")


class SourceTreeLoader(importlib.abc.Loader):
    """Runs one module of the plugin's tree, then the stand-in's changes to it."""

    def __init__(self, path: str, top: bool, package: bool, stand_in: StandIn) -> None:
        self.path = path
        self.top = top
        self.package = package
        self.stand_in = stand_in

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        if self.top:
            self.stand_in.notes.append(
                f"{module.__name__}/__init__.py not run (the plugin's registration entry)"
            )
            return
        with open(self.path, encoding="utf-8") as f:
            source = f.read()
        self.stand_in.before(source)
        try:
            exec(compile(source, self.path, "exec"), vars(module))
        except Exception as missing:  # noqa: BLE001 - a package falls back, a module raises
            if not self.package:
                raise
            # A package whose __init__ needs what is not here (the device runtime, a vLLM
            # module of another release): its modules still import one by one.
            for key in [k for k in vars(module) if not k.startswith("__")]:
                delattr(module, key)
            self.stand_in.notes.append(
                f"{module.__name__}/__init__.py not importable here ({type(missing).__name__}: {missing}): an empty package"
            )
            return
        self.stand_in.after(module, source)


class SourceTreeFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of one top package in a source folder."""

    def __init__(self, folder: str, top: str, stand_in: StandIn) -> None:
        self.folder = folder
        self.top = top
        self.stand_in = stand_in

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.top and not fullname.startswith(self.top + "."):
            return None
        base = os.path.join(self.folder, *fullname.split("."))
        init = os.path.join(base, "__init__.py")
        if os.path.isfile(init):
            loader = SourceTreeLoader(init, fullname == self.top, True, self.stand_in)
            spec = importlib.util.spec_from_file_location(
                fullname, init, loader=loader, submodule_search_locations=[base]
            )
            return spec
        if os.path.isfile(base + ".py"):
            loader = SourceTreeLoader(base + ".py", False, False, self.stand_in)
            return importlib.util.spec_from_file_location(fullname, base + ".py", loader=loader)
        if os.path.isdir(base) and fullname != self.top:
            # A folder with no __init__.py: a namespace package of the tree.
            spec = importlib.machinery.ModuleSpec(fullname, NamespaceLoader(), is_package=True)
            spec.submodule_search_locations = [base]
            return spec
        return None


class NamespaceLoader(importlib.abc.Loader):
    """A source folder without `__init__.py`: an empty package."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def load_file(path: str, stand_in: str = "auto") -> Loaded:
    """The module in `path`, imported from its source tree (or alone) with the stand-in."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--file {path}: no such file")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    notes: List[str] = []
    helper = StandIn(choose_stand_in(source, stand_in), notes)
    folder, dotted = package_root(path)
    if folder is not None and dotted is not None:
        top = dotted.split(".")[0]
        existing = [
            f for f in sys.meta_path if isinstance(f, SourceTreeFinder) and f.top == top
        ]
        if existing and existing[0].folder != folder:
            raise ImportError(
                f"--file {path}: package {top} is already imported from {existing[0].folder}; "
                "one process loads one source tree of a package"
            )
        if existing:
            notes.append(f"{top} already imported from its source tree {folder}")
        elif installed(top):
            notes.append(f"{top} is installed: imported from the installed package")
        else:
            sys.meta_path.insert(0, SourceTreeFinder(folder, top, helper))
            notes.append(f"{top} imported from its source tree {folder}")
        module = importlib.import_module(dotted)
        return Loaded(module, notes)
    helper.before(source)
    helper.provide_missing(source)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"--file {path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    helper.after(module, source)
    return Loaded(module, notes)


def defined_subclasses(module: types.ModuleType, base: type) -> List[type]:
    """The subclasses of `base` that `module` itself defines (not those it imports)."""
    return [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, base) and v is not base
        and v.__module__ == module.__name__
    ]


def only_backend(module: types.ModuleType, base: type) -> type:
    found = defined_subclasses(module, base)
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise LookupError(
            f"{module.__file__} defines {len(found)} attention backends ({names}): "
            "name one with --class"
        )
    return found[0]


Hook = Callable[..., Any]


def load_hook(spec: str) -> Hook:
    """`module:function` or `path/to/file.py:function` as a callable."""
    if ":" not in spec:
        raise ValueError(f"{spec!r}: expected module:function or file.py:function")
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        module = load_file(where, "none").module
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {where} has no function {name!r}")
    return fn
