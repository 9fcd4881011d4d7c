"""python -m attn_diff_adapter.ci (the composite action's check step, action/check.sh): one check,
its files (summary.json, summary.md, junit.xml, replays/), the job summary and the exit status.
The action's script on a stand-in plugin repository with the wheel installed is
xtask/tests/wheel.rs."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTERS = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(ADAPTERS))


def run_ci(tmp_path, binary, *args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_DIFF_")}
    full_env.update({"PYTHONPATH": ADAPTERS, "ATTN_DIFF": binary,
                     "GITHUB_STEP_SUMMARY": str(tmp_path / "step.md")})
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "attn_diff_adapter.ci", "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, env=full_env, cwd=tmp_path, timeout=600)


def test_a_divergence_fails_with_the_summary_junit_and_replay_files(tmp_path, attn_diff_binary):
    broken = os.path.join(HERE, "broken_gqa_adapter.py")
    proc = run_ci(tmp_path, attn_diff_binary, "--adapter", f"{sys.executable} {broken}",
                  "--name", "broken", "--cases", "40", "--traces", "0")
    out = tmp_path / "out"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = (out / "summary.md").read_text()
    assert "**diverged**" in summary and "external:broken diverged" in summary, summary
    assert (tmp_path / "step.md").read_text().strip() == summary.strip()
    junit = (out / "junit.xml").read_text()
    assert '<testcase classname="attn-diff.external:broken" name="property cases">' in junit, junit
    assert "<failure message=" in junit and "shrunk" in junit, junit
    assert any(n.endswith(".json") for n in os.listdir(out / "replays"))
    assert (out / "summary.json").is_file()


def test_an_adapter_that_agrees_passes_with_inputs_from_the_environment(tmp_path, attn_diff_binary):
    reference = os.path.join(ADAPTERS, "numpy_reference.py")
    proc = run_ci(tmp_path, attn_diff_binary, env={
        "ATTN_DIFF_ADAPTER": f"{sys.executable} {reference}",
        "ATTN_DIFF_CASES": "12", "ATTN_DIFF_TRACES": "0", "ATTN_DIFF_ONLY": "dtypes=f32\nmax_seqs=2\n"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert ": passed" in summary, summary
    assert "<failure" not in (tmp_path / "out" / "junit.xml").read_text()
    assert os.listdir(tmp_path / "out" / "replays") == []


def test_an_adapter_that_does_not_start_is_exit_2_and_says_why(tmp_path, attn_diff_binary):
    proc = run_ci(tmp_path, attn_diff_binary, "--adapter", "/no/such/adapter")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "could not run" in (tmp_path / "out" / "summary.md").read_text()
    assert "<error" in (tmp_path / "out" / "junit.xml").read_text()


def test_exactly_one_of_backend_and_adapter(tmp_path, attn_diff_binary):
    proc = run_ci(tmp_path, attn_diff_binary)
    assert proc.returncode == 2 and "exactly one of --backend" in proc.stderr, proc.stderr


def test_the_action_passes_every_input_to_the_script():
    action = open(os.path.join(REPO, "action.yml")).read()
    script = open(os.path.join(REPO, "action", "check.sh")).read()
    assert '"$GITHUB_ACTION_PATH/action/check.sh"' in action
    assert "-m attn_diff_adapter.ci" in script
