"""The pytest plugin (loaded by the package's ``pytest11`` entry point): an ``attn_diff``
fixture and marker that check an adapter or a vLLM attention backend with attn-diff, and fail
the test with the shrunk report when it diverges.

A marker that names what to check makes the test that check (its body runs first, as set-up)::

    @pytest.mark.attn_diff(script="my_adapter.py", only={"dtypes": "bf16"}, cases=200)
    def test_my_adapter_agrees_with_attn_diff():
        pass

    @pytest.mark.attn_diff(backend="my_plugin.attention:MyBackend")
    def test_my_backend():
        pass

The fixture does the same from a test body::

    def test_my_adapter(attn_diff):
        attn_diff.check_adapter([sys.executable, "my_adapter.py"], only=["dtypes=bf16"])

The marker's keywords (``adapter``, ``script``, ``backend``, ``file``, ``only``, ``cases``,
``traces``, ``seed``, ``args``, ``env``, ``name``, ``min_reached``, ``timeout``,
``adapter_timeout``) are also the fixture's defaults for that test. Options:

- ``--attn-diff-cases N``, ``--attn-diff-traces N``, ``--attn-diff-seed N``: the defaults for
  checks that do not set their own (300, 20 and 1).
- ``--attn-diff-binary PATH``: the binary (else as :func:`~attn_diff_adapter.testing.find_binary`
  finds it: ``$ATTN_DIFF``, the one installed with this package, PATH).
- ``--attn-diff-out DIR``: replay files under ``DIR/<test>`` instead of the test's
  ``tmp_path``. Never the current directory.
- ``--attn-diff-missing {fail,skip}``: a missing or mismatched binary fails the test (the
  default) or, explicitly, skips it. Also the ini option ``attn_diff_missing``.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Dict, Optional, Sequence, Union

import pytest

from attn_diff_adapter import testing
from attn_diff_adapter.testing import BinaryNotFound, BinaryVersionMismatch, CheckResult

MARK = "attn_diff"

#: What a marker may say: the target (one of them) and the check's settings.
TARGETS = ("adapter", "script", "backend")
SETTINGS = (
    "file",
    "only",
    "cases",
    "traces",
    "seed",
    "args",
    "env",
    "name",
    "min_reached",
    "timeout",
    "adapter_timeout",
    "adapter_args",
    "python",
)

DEFAULTS = {"cases": 300, "traces": 20, "seed": 1}

#: Every check's counts and invariance lines, per test, for the terminal summary.
_NOTES = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attn-diff", "attn-diff: check attention backends against its oracle")
    group.addoption("--attn-diff-cases", type=int, metavar="N", default=None,
                    help="property cases per check that sets none (default 300)")
    group.addoption("--attn-diff-traces", type=int, metavar="N", default=None,
                    help="serving traces per check that sets none (default 20)")
    group.addoption("--attn-diff-seed", type=int, metavar="N", default=None,
                    help="seed of checks that set none (default 1)")
    group.addoption("--attn-diff-binary", metavar="PATH", default=None,
                    help="the attn-diff binary (default: $ATTN_DIFF, the installed one, PATH)")
    group.addoption("--attn-diff-out", metavar="DIR", default=None,
                    help="write replay files under DIR/<test> (default: the test's tmp_path)")
    group.addoption("--attn-diff-missing", choices=("fail", "skip"), default=None,
                    help="a missing or mismatched attn-diff binary fails the test (default) or skips it")
    parser.addini("attn_diff_missing", "fail (default) or skip: what a missing attn-diff binary does",
                  default="fail")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "attn_diff(adapter=None, script=None, backend=None, **settings): check an adapter "
        "command, an adapter script (beside the test file) or a vLLM backend class with "
        "attn-diff; the settings (only, cases, traces, seed, ...) are also the attn_diff "
        "fixture's defaults",
    )
    missing = _missing_mode(config)
    if missing not in ("fail", "skip"):
        raise pytest.UsageError(f"attn_diff_missing = {missing!r}: expected 'fail' or 'skip'")


def _missing_mode(config: pytest.Config) -> str:
    return config.getoption("attn_diff_missing") or str(config.getini("attn_diff_missing")).strip()


def _option(config: pytest.Config, key: str) -> Optional[Any]:
    return config.getoption(f"attn_diff_{key}")


class AttnDiff:
    """The ``attn_diff`` fixture: attn-diff checks for one test, writing replay files under
    its ``tmp_path`` (or ``--attn-diff-out``), with the marker's and the options' defaults."""

    def __init__(self, config: pytest.Config, node: pytest.Item, out_dir: str,
                 defaults: Dict[str, Any]) -> None:
        self._config = config
        self._node = node
        self.out_dir = out_dir
        self._defaults = defaults
        self._binary: Optional[str] = None

    @property
    def binary(self) -> str:
        """The binary the checks run (found and version-checked on first use); a missing or
        mismatched one fails the test, or skips it under ``--attn-diff-missing=skip``."""
        if self._binary is None:
            try:
                found = testing.find_binary(_option(self._config, "binary"))
                self._binary = testing.check_binary_version(found)
            except (BinaryNotFound, BinaryVersionMismatch) as e:
                if _missing_mode(self._config) == "skip":
                    pytest.skip(f"attn-diff: {e} (skipped: --attn-diff-missing=skip)")
                pytest.fail(
                    f"attn-diff: {e}\n(this fails the test; --attn-diff-missing=skip, or "
                    "attn_diff_missing = skip in the ini file, skips it instead)",
                    pytrace=False,
                )
        return self._binary

    def _settings(self, given: Dict[str, Any]) -> Dict[str, Any]:
        settings = dict(self._defaults)
        settings.update({k: v for k, v in given.items() if v is not None})
        for key, default in DEFAULTS.items():
            if key not in settings:
                option = _option(self._config, key)
                settings[key] = default if option is None else option
        return settings

    def check_adapter(self, command: Union[str, Sequence[str]], **given: Any) -> CheckResult:
        """:func:`~attn_diff_adapter.testing.check_adapter` with this test's defaults."""
        _reject_unknown(given, allowed=SETTINGS + ("fail",), what="check_adapter")
        settings = self._settings(given)
        for key in ("file", "adapter_args", "python"):
            if key in settings:
                raise pytest.UsageError(f"attn_diff: {key}= applies to backend= checks only")
        return self._judged(testing.check_adapter, command, settings)

    def check_script(self, script: str, **given: Any) -> CheckResult:
        """An adapter script run by this interpreter; a relative path is taken from the test
        file's directory."""
        return self.check_adapter([sys.executable, self._beside_test(script)], **given)

    def check_backend(self, backend: Optional[str] = None, **given: Any) -> CheckResult:
        """:func:`~attn_diff_adapter.testing.check_backend` with this test's defaults."""
        _reject_unknown(given, allowed=SETTINGS + ("fail",), what="check_backend")
        settings = self._settings(given)
        if "name" in settings:
            raise pytest.UsageError("attn_diff: name= applies to adapter checks only")
        if "file" in settings:
            settings["file"] = self._beside_test(settings["file"])
        return self._judged(testing.check_backend, backend, settings)

    def _judged(self, check: Any, target: Any, settings: Dict[str, Any]) -> CheckResult:
        """Run `check` unjudged, note what it did on the test (passed or not), then judge it
        as `check` would have."""
        fail = settings.pop("fail", True)
        result = check(target, binary=self.binary, out_dir=self.out_dir, fail=False, **settings)
        self._note(result)
        return testing._judge(result, fail, settings.get("min_reached", 1))

    def _note(self, result: CheckResult) -> None:
        """What a check did, where a passing test shows it too: the test's user properties
        (JUnit's ``<property>``) and the session's attn-diff summary section."""
        if result.summary is None:
            return
        lines = [result.counts_line()] + result.invariance_lines()
        for line in lines:
            self._node.user_properties.append(("attn_diff", line))
        self._config.stash.setdefault(_NOTES, []).append((self._node.nodeid, lines))

    def _beside_test(self, path: str) -> str:
        if os.path.isabs(path):
            return path
        return os.path.join(os.path.dirname(str(self._node.path)), path)

    def check_marked(self, mark: pytest.Mark) -> Optional[CheckResult]:
        """The check the marker names, if it names one."""
        kwargs = dict(mark.kwargs)
        targets = [t for t in TARGETS if kwargs.get(t) is not None]
        if not targets:
            return None
        if len(targets) > 1:
            raise pytest.UsageError(
                f"{self._node.nodeid}: @pytest.mark.attn_diff names {' and '.join(targets)}; "
                "give one of adapter=, script=, backend="
            )
        target = targets[0]
        value = kwargs[target]
        if target == "adapter":
            return self.check_adapter(value)
        if target == "script":
            return self.check_script(value)
        return self.check_backend(value)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One section listing every attn-diff check of the session: its counts and, per
    backend, which invariance relations held bit for bit and how far the others moved."""
    notes = config.stash.get(_NOTES, [])
    if not notes:
        return
    terminalreporter.section("attn-diff")
    for nodeid, lines in notes:
        terminalreporter.write_line(nodeid)
        for line in lines:
            terminalreporter.write_line(f"  {line}")


def _reject_unknown(kwargs: Dict[str, Any], allowed: Sequence[str], what: str) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise pytest.UsageError(
            f"{what}: unknown keyword(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )


def _mark_defaults(node: pytest.Item) -> Dict[str, Any]:
    mark = node.get_closest_marker(MARK)
    if mark is None:
        return {}
    if mark.args:
        raise pytest.UsageError(
            f"{node.nodeid}: @pytest.mark.attn_diff takes keywords only (adapter=, script=, "
            "backend=, only=, cases=, ...)"
        )
    _reject_unknown(dict(mark.kwargs), allowed=TARGETS + SETTINGS, what=f"{node.nodeid}: @pytest.mark.attn_diff")
    return {k: v for k, v in mark.kwargs.items() if k in SETTINGS and v is not None}


def _safe_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:120] or "test"


@pytest.fixture
def attn_diff(request: pytest.FixtureRequest) -> AttnDiff:
    """attn-diff checks for this test: ``attn_diff.check_adapter(cmd, ...)``,
    ``attn_diff.check_script("adapter.py", ...)``, ``attn_diff.check_backend("pkg:Class", ...)``.
    A divergence fails the test with the shrunk report and a replay command that runs as
    printed; replay files go under the test's ``tmp_path`` (or ``--attn-diff-out``)."""
    node = request.node
    configured = _option(request.config, "out")
    if configured:
        out = os.path.join(os.path.abspath(configured), _safe_name(node.nodeid))
        os.makedirs(out, exist_ok=True)
    else:
        out = str(request.getfixturevalue("tmp_path") / "attn-diff")
        os.makedirs(out, exist_ok=True)
    return AttnDiff(request.config, node, out, _mark_defaults(node))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    result = yield
    mark = item.get_closest_marker(MARK)
    if mark is not None:
        request = getattr(item, "_request", None)
        if request is None:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.attn_diff applies to test functions")
        fixture: AttnDiff = request.getfixturevalue("attn_diff")
        fixture.check_marked(mark)
    return result
