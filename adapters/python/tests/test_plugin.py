"""The pytest plugin (attn_diff_adapter.pytest_plugin), run as a user's pytest runs it: in a
subprocess from a project of its own, loaded with -p as the installed entry point loads it.
The wheel's end-to-end run (a planted bug caught, the replay command run as printed) is
xtask/tests/wheel.rs."""

import os
import re
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTERS = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(ADAPTERS))


def run_pytest(project, test_source, *args, env=None):
    (project / "test_user.py").write_text(textwrap.dedent(test_source))
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ADAPTERS
    # The plugin by -p alone: an egg-info a build left in the checkout would load it twice.
    full_env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "attn_diff_adapter.pytest_plugin", "-p",
         "no:cacheprovider", "-rA", "--basetemp", str(project / "tmp"), *args],
        cwd=project, capture_output=True, text=True, env=full_env, timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


MARKED_REFERENCE = f"""
    import pytest

    @pytest.mark.attn_diff(adapter=[{sys.executable!r}, {os.path.join(ADAPTERS, "numpy_reference.py")!r}],
                           traces=0)
    def test_reference():
        pass
"""


def test_a_marked_adapter_that_agrees_passes(tmp_path, attn_diff_binary):
    junit = tmp_path / "junit.xml"
    code, out = run_pytest(tmp_path, MARKED_REFERENCE, "--attn-diff-cases", "30",
                           "--junitxml", str(junit), env={"ATTN_DIFF": attn_diff_binary})
    assert code == 0, out
    assert "1 passed" in out, out
    # A passing check still says what reached the backend and what its invariance pairs did
    # (30 cases draw 3 pairs), in the session's summary and in the test's JUnit properties.
    summary = out.split("attn-diff ==")[-1]
    assert "test_user.py::test_reference" in summary, out
    judged = re.search(r"reached the backend, .*, (\d+) invariance pair\(s\) judged, 0 moved", summary)
    assert judged and int(judged.group(1)) >= 1, out
    line = re.search(r"invariance of external:adapter \(bit for bit; declared relations marked \*\): .+", summary)
    assert line and re.search(r"(held|moved in) \d+ of \d+", line.group(0)), out
    xml = junit.read_text()
    assert '<property name="attn_diff" value="invariance of external:adapter' in xml, xml


def test_the_fixture_catches_a_wrong_adapter_with_a_replay_command_that_runs(tmp_path, attn_diff_binary):
    broken = os.path.join(HERE, "broken_gqa_adapter.py")
    code, out = run_pytest(tmp_path, f"""
        import sys
        def test_broken(attn_diff):
            attn_diff.check_adapter([sys.executable, {broken!r}], name="broken", cases=60, traces=0)
    """, env={"ATTN_DIFF": attn_diff_binary})
    assert code == 1 and "1 failed" in out, out
    assert "external:broken diverged" in out and "shrunk" in out, out
    # Under pytest's tmp_path (here --basetemp), not the project directory.
    replay = re.search(r"replay:  (.+)", out).group(1)
    assert str(tmp_path / "tmp") in replay, replay
    assert replay.startswith(attn_diff_binary) or replay.startswith("'" + attn_diff_binary), replay
    again = subprocess.run(["sh", "-c", replay], cwd="/", capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "diverged" in again.stdout + again.stderr, again


def test_a_missing_binary_fails_loudly_unless_skipping_is_asked_for(tmp_path):
    env = {"ATTN_DIFF": str(tmp_path / "no-such-binary")}
    code, out = run_pytest(tmp_path, MARKED_REFERENCE, env=env)
    assert code == 1 and "1 failed" in out, out
    assert "no-such-binary is not an executable file" in out and "--attn-diff-missing=skip" in out, out
    code, out = run_pytest(tmp_path, MARKED_REFERENCE, "--attn-diff-missing=skip", env=env)
    assert code == 0 and "1 skipped" in out, out
    (tmp_path / "pytest.ini").write_text("[pytest]\nattn_diff_missing = skip\n")
    code, out = run_pytest(tmp_path, MARKED_REFERENCE, env=env)
    assert code == 0 and "1 skipped" in out, out
    (tmp_path / "pytest.ini").write_text("[pytest]\nattn_diff_missing = maybe\n")
    code, out = run_pytest(tmp_path, MARKED_REFERENCE, env=env)
    assert code != 0 and "attn_diff_missing = 'maybe'" in out, out


def test_a_binary_of_another_version_is_a_clear_error(tmp_path):
    fake = tmp_path / "attn-diff"
    fake.write_text("#!/bin/sh\necho 'attn-diff 9.9.9'\n")
    fake.chmod(0o755)
    code, out = run_pytest(tmp_path, MARKED_REFERENCE, env={"ATTN_DIFF": str(fake)})
    assert code == 1, out
    assert "is version 9.9.9, but this attn-diff is" in out, out


def test_a_marker_with_a_bad_keyword_or_two_targets_is_a_usage_error(tmp_path, attn_diff_binary):
    code, out = run_pytest(tmp_path, """
        import pytest
        @pytest.mark.attn_diff(script="a.py", casess=3)
        def test_typo():
            pass
        @pytest.mark.attn_diff(script="a.py", backend="m:C")
        def test_two():
            pass
    """, env={"ATTN_DIFF": attn_diff_binary})
    assert code != 0, out
    assert "unknown keyword(s) casess" in out, out
    assert "names script and backend" in out, out


def test_the_package_version_is_the_binarys_and_the_workspaces(attn_diff_binary):
    import attn_diff
    from attn_diff_adapter import testing

    workspace = open(os.path.join(REPO, "Cargo.toml")).read()
    version = re.search(r'\[workspace\.package\][^\[]*?\nversion = "([^"]+)"', workspace).group(1)
    assert attn_diff.__version__ == version
    assert testing.binary_version(attn_diff_binary) == version


def test_python_m_attn_diff_in_a_checkout_says_there_is_no_installed_binary():
    proc = subprocess.run([sys.executable, "-m", "attn_diff", "--version"], cwd=ADAPTERS,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ADAPTERS})
    assert proc.returncode == 2, proc
    assert "carries no attn-diff binary" in proc.stderr, proc.stderr


def test_the_options_are_in_pytests_help(tmp_path):
    code, out = run_pytest(tmp_path, "def test_x():\n    pass\n", "--help")
    assert code == 0, out
    for option in ("--attn-diff-cases", "--attn-diff-traces", "--attn-diff-seed", "--attn-diff-binary",
                   "--attn-diff-out", "--attn-diff-missing"):
        assert option in out, out
