"""Run attn-diff from a test suite: one call checks a backend, and a divergence fails the test
with attn-diff's shrunk report.

A vLLM attention-backend plugin tests its backend class the way vLLM drives it (its metadata
builder, KV-cache layout, cache write and ``forward``; ``vllm_backend.py``) against attn-diff's
float64 oracle::

    from attn_diff_adapter.testing import check_backend

    def test_my_backend_agrees_with_attn_diff():
        check_backend("my_plugin.attention:MyAttentionBackend", cases=300, traces=20)

Any other adapter (a program speaking attn-diff's protocol) is checked with
:func:`check_adapter`::

    check_adapter(["python3", "my_adapter.py"], cases=300, only=["dtypes=bf16"])

The ``attn-diff`` binary comes from the ``binary`` argument, else ``$ATTN_DIFF``, else the
one installed with this package (``pip install`` builds it into the environment's ``bin/``),
else ``PATH``; none found is :class:`BinaryNotFound` (a test can turn it into a skip, by
name, with :func:`require_binary`). A binary whose ``--version`` is not this package's is
:class:`BinaryVersionMismatch`. The pytest plugin (:mod:`attn_diff_adapter.pytest_plugin`,
loaded by the ``pytest11`` entry point) wraps these calls in an ``attn_diff`` fixture and
marker. Both calls return a :class:`CheckResult`; on a divergence they call
``pytest.fail`` with the report (with ``fail=False`` they return it instead), and they also
fail when no case reached the backend (every one declined), since such a run proves nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

__all__ = [
    "BinaryNotFound",
    "BinaryVersionMismatch",
    "CheckResult",
    "check_adapter",
    "check_backend",
    "binary_version",
    "find_binary",
    "require_binary",
    "vllm_backend_command",
]

#: The environment variable naming the attn-diff binary.
ENV_BINARY = "ATTN_DIFF"

#: `--only` values: "KEY=VALUES" strings, or a mapping from key to a value or a list of them.
Only = Union[Sequence[str], Mapping[str, Any], None]


#: How to get a binary, for the messages that say there is none.
HOW_TO_GET_ONE = (
    "`pip install attn-diff` (or `pip install ./adapters/python` in an attn-diff "
    "checkout) builds and installs it; from source, `cargo build --release -p attn-harness "
    "--no-default-features --features mutants` needs no libtorch (leave out "
    "`--no-default-features` for the Spyre backends, after `cargo xtask setup`)"
)


class BinaryNotFound(FileNotFoundError):
    """No attn-diff binary: none given, none in ``$ATTN_DIFF``, none installed with this
    package, none on PATH."""


class BinaryVersionMismatch(RuntimeError):
    """The attn-diff binary found is not this package's version: the helper and the binary
    speak one version of the summary and the protocol."""


def _installed_binary() -> Optional[str]:
    try:
        from attn_diff import installed_binary
    except ImportError:
        return None
    return installed_binary()


def package_version() -> str:
    """This package's version, which the binary must report."""
    from attn_diff import __version__

    return __version__


def find_binary(binary: Optional[str] = None) -> str:
    """The attn-diff binary to run: `binary`, else ``$ATTN_DIFF``, else the binary installed
    with this package, else ``attn-diff`` on PATH.

    A name without a slash is looked up on PATH; a path must be an executable file."""
    tried: List[str] = []
    installed = _installed_binary()
    if not binary and not os.environ.get(ENV_BINARY) and installed:
        return installed
    for source, candidate in (
        ("the binary argument", binary),
        (f"${ENV_BINARY}", os.environ.get(ENV_BINARY)),
        ("PATH", "attn-diff"),
    ):
        if not candidate:
            continue
        if os.sep in candidate or (os.altsep and os.altsep in candidate):
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return os.path.abspath(candidate)
            tried.append(f"{source}: {candidate} is not an executable file")
            if source != "PATH":
                # An explicit choice that does not exist is a mistake, not a fallback.
                break
        else:
            found = shutil.which(candidate)
            if found:
                return found
            tried.append(f"{source}: no {candidate!r} on PATH")
            if source != "PATH":
                break
    raise BinaryNotFound(
        "attn-diff binary not found ("
        + "; ".join(tried + ([] if installed else ["none installed with attn-diff"]))
        + f"). {HOW_TO_GET_ONE}; then pass binary=..., set ${ENV_BINARY} to it "
        "(target/release/attn-diff), or put it on PATH."
    )


_VERSIONS: Dict[str, str] = {}


def binary_version(exe: str) -> str:
    """The version `exe --version` reports ("attn-diff 0.1.0" gives "0.1.0")."""
    if exe in _VERSIONS:
        return _VERSIONS[exe]
    try:
        proc = subprocess.run([exe, "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=60)
    except OSError as e:
        raise BinaryNotFound(f"cannot run the attn-diff binary {exe}: {e}") from e
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 2 or words[0] != "attn-diff":
        raise BinaryVersionMismatch(
            f"{exe} is not an attn-diff binary: `--version` gave exit {proc.returncode} and "
            f"{(proc.stdout.strip() or proc.stderr.strip())[:200]!r}, not 'attn-diff VERSION'"
        )
    _VERSIONS[exe] = words[1]
    return words[1]


def check_binary_version(exe: str) -> str:
    """`exe`, after checking that it reports this package's version; else
    :class:`BinaryVersionMismatch` naming both."""
    theirs, ours = binary_version(exe), package_version()
    if theirs != ours:
        raise BinaryVersionMismatch(
            f"the attn-diff binary {exe} is version {theirs}, but this attn-diff is "
            f"{ours}: the helper reads the summary of its own version only. Install the "
            f"matching pair (`pip install attn-diff=={theirs}`, or rebuild the binary "
            f"from the checkout this package came from), or point ${ENV_BINARY} at a {ours} "
            "binary."
        )
    return exe


def require_binary(binary: Optional[str] = None) -> str:
    """:func:`find_binary`, or ``pytest.skip`` naming why when there is none: an explicit
    opt-in to skipping (the pytest plugin's fixture fails the test instead)."""
    try:
        return find_binary(binary)
    except BinaryNotFound as missing:
        import pytest

        pytest.skip(str(missing))
        raise  # unreachable: pytest.skip raises


@dataclass
class CheckResult:
    """What one ``attn-diff check`` run gave."""

    command: List[str]
    returncode: int
    stdout: str
    stderr: str
    #: The JSON summary (``--format json``), when the run produced one.
    summary: Optional[Dict[str, Any]] = None
    #: Where replay files of shrunk failures were written.
    out_dir: str = ""
    #: The binary (and the environment the run added) that the reports' replay commands
    #: start with, so they run as printed; empty leaves them as attn-diff printed them.
    replay_prefix: str = ""
    _backends: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.summary is not None:
            self._backends = list(self.summary.get("backends") or [])

    @property
    def passed(self) -> bool:
        """Whether attn-diff exited 0 (every case that ran agreed with the oracle)."""
        return self.returncode == 0

    #: The parts of a check, each with its own tally in the summary (schema 3).
    PARTS = ("property", "upstream", "traces")

    def _sum(self, key: str) -> int:
        """`key` ("sent", "passed", "failed", "declined") of every part of every backend."""
        return sum(int((b.get(part) or {}).get(key) or 0) for b in self._backends for part in self.PARTS)

    @property
    def drawn(self) -> int:
        """Property cases, upstream cases and traces sent to the backend, declined included."""
        return self._sum("sent")

    @property
    def declined(self) -> int:
        """Cases and traces the backend (or its declared capabilities) declined."""
        return self._sum("declined")

    @property
    def reached(self) -> int:
        """Cases and traces that really ran on the backend and were compared."""
        return self._sum("passed") + self._sum("failed")

    @property
    def failed(self) -> int:
        return self._sum("failed")

    def unsupported_lines(self) -> List[str]:
        """Declined cases grouped by reason: "12 unsupported: head size (64, 80)"."""
        lines = []
        for b in self._backends:
            for g in b.get("unsupported") or []:
                detail = " ".join(x for x in (str(g.get("feature", "")), str(g.get("detail", ""))) if x)
                values = g.get("values") or []
                extra = f" ({', '.join(map(str, values))})" if values else ""
                name = (b.get("backend") or {}).get("name")
                lines.append(f"{name}: {g.get('cases')} unsupported: {detail}{extra}")
        return lines

    @property
    def pairs(self) -> Dict[str, int]:
        """Invariance pairs of every backend ("sent", "passed", "failed", "declined"): a pair
        fails when a relation the backend declares moved a bit. Pairs rerun drawn cases, so
        they are counted apart from `drawn` and `reached`."""
        keys = ("sent", "passed", "failed", "declined")
        return {k: sum(int((b.get("pairs") or {}).get(k) or 0) for b in self._backends) for k in keys}

    def invariance_lines(self) -> List[str]:
        """Per backend, what each invariance relation did, as attn-diff's text summary says it:
        "invariance of external:x (bit for bit; declared relations marked *): batch held 3 of
        3, order* moved in 1 of 4 pairs (1 of 9 rows, up to 2 ulps)"."""
        lines = []
        for b in self._backends:
            relations = b.get("invariance") or {}
            if not relations:
                continue
            per = [f"{name}{'*' if t.get('declared') else ''} {_relation_words(t)}" for name, t in relations.items()]
            name = (b.get("backend") or {}).get("name")
            lines.append(f"invariance of {name} (bit for bit; declared relations marked *): {', '.join(per)}")
        return lines

    def report(self) -> str:
        """The shrunk failure reports as attn-diff prints them, then the counts, what the
        invariance relations did and what was declined; without a JSON summary, attn-diff's
        own output."""
        if self.summary is None:
            parts = [self.stdout.strip(), self.stderr.strip()[-8000:]]
            return "\n".join(p for p in parts if p) or f"attn-diff exited {self.returncode}"
        texts = [self._runnable(str(f.get("text", "")).rstrip()) for b in self._backends for f in b.get("failures") or []]
        lines = texts + [self.counts_line()] + self.invariance_lines() + self.unsupported_lines()
        return "\n".join(line for line in lines if line)

    def _runnable(self, text: str) -> str:
        if not self.replay_prefix:
            return text
        return "\n".join(
            _REPLAY_LINE.sub(lambda m: "replay:  " + m.group(1) + self.replay_prefix + " ", line, count=1)
            for line in text.split("\n")
        )

    def replay_commands(self) -> List[str]:
        """The replay command of every shrunk failure, runnable as printed (``sh -c``)."""
        return [
            line[len("replay:  "):]
            for line in self.report().splitlines()
            if line.startswith("replay:  ") and not line.startswith("replay:  (")
        ]

    def counts_line(self) -> str:
        pairs = self.pairs
        judged = pairs["passed"] + pairs["failed"]
        pair_words = f", {judged} invariance pair(s) judged, {pairs['failed']} moved" if pairs["sent"] else ""
        return (
            f"attn-diff check: {self.drawn} drawn, {self.reached} reached the backend, "
            f"{self.declined} declined, {self.failed} failed{pair_words} (exit {self.returncode})"
        )


def _relation_words(t: Mapping[str, Any]) -> str:
    """One relation's tally in words, as `attn_results::invariance::RelationTally::words`."""
    tried, held, not_judged = int(t.get("tried") or 0), int(t.get("held") or 0), int(t.get("not_judged") or 0)
    if tried == 0:
        return f"not tried ({not_judged} not judged)"
    if held == tried:
        words = f"held {held} of {tried}"
    else:
        words = (
            f"moved in {tried - held} of {tried} pairs ({t.get('rows_moved', 0)} of {t.get('rows', 0)} "
            f"rows, up to {t.get('max_ulps', 0)} ulps)"
        )
    if not_judged:
        words += f", {not_judged} not judged"
    return words


def _only_args(only: Only) -> List[str]:
    if only is None:
        return []
    if isinstance(only, Mapping):
        items = []
        for key, value in only.items():
            values = value if isinstance(value, (list, tuple, set)) else [value]
            items.append(f"{key}={','.join(str(v) for v in values)}")
    elif isinstance(only, str):
        items = [only]
    else:
        items = list(only)
    args: List[str] = []
    for item in items:
        args += ["--only", item]
    return args


def _fail(message: str) -> None:
    import pytest

    pytest.fail(message, pytrace=False)


def run_check(
    command: Union[str, Sequence[str]],
    *,
    name: str = "adapter",
    cases: int = 300,
    traces: int = 20,
    only: Only = None,
    seed: int = 1,
    binary: Optional[str] = None,
    args: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    adapter_timeout: Optional[float] = None,
    out_dir: Optional[str] = None,
    cwd: Optional[str] = None,
) -> CheckResult:
    """Run ``attn-diff check`` on the adapter `command` (a list, or one shell-quoted string)
    and return what it gave, without judging it. `env` is added to the environment of
    attn-diff (and so of the adapter); `args` are more ``check`` options (``--deep``,
    ``--spec NAME``, ...)."""
    exe = check_binary_version(find_binary(binary))
    adapter = command if isinstance(command, str) else shlex.join(list(command))
    out = out_dir or tempfile.mkdtemp(prefix="attn-diff-")
    argv = [
        exe,
        "check",
        "--backend",
        f"external:{name}",
        "--external",
        f"{name}={adapter}",
        "--cases",
        str(cases),
        "--traces",
        str(traces),
        "--seed",
        str(seed),
        "--format",
        "json",
        "--out",
        out,
        "-q",
        *_only_args(only),
        *args,
    ]
    if adapter_timeout is not None:
        argv += ["--external-timeout", str(adapter_timeout)]
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
    summary: Optional[Dict[str, Any]] = None
    try:
        parsed = json.loads(proc.stdout)
        if isinstance(parsed, dict) and "backends" in parsed:
            summary = parsed
    except ValueError:
        pass
    result = CheckResult(argv, proc.returncode, proc.stdout, proc.stderr, summary, out)
    result.replay_prefix = _replay_prefix(exe, env)
    return result


#: A report's replay line: the environment the backend declared (``NAME=value`` words,
#: shell-quoted), then the bare binary name.
_REPLAY_LINE = re.compile(r"^replay:  ((?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|\S+) )*)attn-diff ")


def _replay_prefix(exe: str, env: Optional[Mapping[str, str]]) -> str:
    """What replaces a report's leading ``attn-diff`` so its replay command runs as printed
    from any shell: this binary's path, after the environment this run added."""
    assignments = [f"{k}={v}" for k, v in (env or {}).items()]
    prefix = shlex.join(["env", *assignments]) + " " if assignments else ""
    return prefix + shlex.quote(exe)


def _judge(result: CheckResult, fail: bool, min_reached: int) -> CheckResult:
    if not fail:
        return result
    if result.returncode == 2 or result.summary is None and result.returncode != 0:
        _fail(
            f"attn-diff could not run the check (exit {result.returncode}):\n"
            + (result.stderr.strip()[-8000:] or result.stdout.strip()[-8000:])
            + "\ncommand: "
            + shlex.join(result.command)
        )
    if result.returncode != 0:
        _fail(result.report() + f"\nreplay files: {result.out_dir}")
    if result.summary is not None and result.reached < min_reached:
        _fail(
            f"only {result.reached} case(s) reached the backend (at least {min_reached} "
            "wanted): the run proves nothing.\n" + "\n".join([result.counts_line()] + result.unsupported_lines())
        )
    return result


def check_adapter(
    command: Union[str, Sequence[str]],
    *,
    name: str = "adapter",
    cases: int = 300,
    traces: int = 20,
    only: Only = None,
    seed: int = 1,
    binary: Optional[str] = None,
    args: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    adapter_timeout: Optional[float] = None,
    out_dir: Optional[str] = None,
    min_reached: int = 1,
    fail: bool = True,
) -> CheckResult:
    """Run ``attn-diff check`` on an adapter program and fail the calling test (``pytest.fail``
    with the shrunk report) when it diverges, when attn-diff cannot run it, or when fewer
    than `min_reached` cases reached it.

    `command`: the adapter, e.g. ``[sys.executable, "my_adapter.py"]``. `only`: ``--only``
    narrowings, e.g. ``["dtypes=bf16", "head_sizes=64,128"]`` or ``{"dtypes": "bf16"}``.
    `cases` property cases and `traces` serving traces from `seed`. With ``fail=False`` the
    :class:`CheckResult` is returned whatever happened."""
    result = run_check(
        command,
        name=name,
        cases=cases,
        traces=traces,
        only=only,
        seed=seed,
        binary=binary,
        args=args,
        env=env,
        timeout=timeout,
        adapter_timeout=adapter_timeout,
        out_dir=out_dir,
    )
    return _judge(result, fail, min_reached)


def _package_dir() -> str:
    """The directory holding this package and `vllm_backend.py` (site-packages once
    installed, `adapters/python` in a checkout)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def vllm_backend_command(
    backend: Optional[str] = None,
    *,
    file: Optional[str] = None,
    python: Optional[str] = None,
    extra: Sequence[str] = (),
) -> List[str]:
    """The adapter command that drives a vLLM attention backend class through
    ``vllm_backend.py``: `backend` as ``"module.path:Class"`` (or a registry name such as
    ``"CPU_ATTN"``), or a class name with `file` the Python file defining it."""
    script = os.path.join(_package_dir(), "vllm_backend.py")
    if not os.path.isfile(script):
        raise FileNotFoundError(f"{script} is missing: reinstall attn-diff")
    cmd = [python or sys.executable, script]
    if file is not None:
        cmd += ["--file", os.path.abspath(file)]
    if backend is not None:
        cmd += ["--class", backend]
    return cmd + list(extra)


def _child_pythonpath() -> str:
    """sys.path of this process (the test's rootdir and conftest directories included) as a
    PYTHONPATH, so the adapter imports the plugin the test imports."""
    entries = [_package_dir()] + [p if p else os.getcwd() for p in sys.path]
    seen: Dict[str, None] = {}
    for p in entries:
        if os.path.isdir(p):
            seen.setdefault(os.path.abspath(p), None)
    return os.pathsep.join(seen)


def check_backend(
    backend: Optional[str] = None,
    *,
    file: Optional[str] = None,
    cases: int = 300,
    traces: int = 20,
    only: Only = None,
    seed: int = 1,
    binary: Optional[str] = None,
    python: Optional[str] = None,
    adapter_args: Sequence[str] = (),
    args: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    adapter_timeout: Optional[float] = 300,
    out_dir: Optional[str] = None,
    min_reached: int = 1,
    fail: bool = True,
) -> CheckResult:
    """Check a vLLM v1 ``AttentionBackend`` class with attn-diff, driven as vLLM's model
    runner drives it (``vllm_backend.py``), and fail the calling test with the shrunk report
    when it diverges.

    `backend`: ``"my_plugin.attention:MyBackend"`` (or a name in vLLM's backend registry,
    ``"CPU_ATTN"``); or ``backend="MyBackend", file="path/to/attention.py"``. The adapter
    runs in `python` (default: this interpreter) with this process's ``sys.path`` as its
    ``PYTHONPATH``, so it imports the plugin the test imports. The case space is what the
    class declares (dtypes, head sizes, block sizes, KV-cache dtypes, sinks, attention
    types), narrowed by `only`. `adapter_args` go to ``vllm_backend.py`` (``--padding
    none``, ...). Other arguments as for :func:`check_adapter`."""
    if backend is None and file is None:
        raise ValueError("check_backend needs a backend class ('module:Class') or a file")
    command = vllm_backend_command(backend, file=file, python=python, extra=adapter_args)
    child_env = {"PYTHONPATH": _child_pythonpath()}
    child_env.update(env or {})
    result = run_check(
        command,
        name="vllm-backend",
        cases=cases,
        traces=traces,
        only=only,
        seed=seed,
        binary=binary,
        args=args,
        env=child_env,
        timeout=timeout,
        adapter_timeout=adapter_timeout,
        out_dir=out_dir,
    )
    return _judge(result, fail, min_reached)
