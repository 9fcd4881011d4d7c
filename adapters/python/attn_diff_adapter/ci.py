"""``python -m attn_diff_adapter.ci``: one attn-diff check for a CI job, with the files a CI
system keeps. It is what this repository's composite action (``action.yml``) runs, and it runs
the same anywhere else (a laptop, another CI system):

    python -m attn_diff_adapter.ci --backend my_plugin.attention:MyBackend --out attn-diff-out
    python -m attn_diff_adapter.ci --adapter "python my_adapter.py" --only dtypes=bf16

It runs ``attn-diff check`` once (``--format json``) on a vLLM backend class (``--backend``,
driven by ``vllm_backend.py``) or an adapter command (``--adapter``), and writes into ``--out``:

- ``summary.json``: attn-diff's JSON summary;
- ``summary.md``: a markdown summary (counts per backend and part, every shrunk failure with
  its replay command), also appended to ``$GITHUB_STEP_SUMMARY`` when that is set;
- ``junit.xml``: one test case per backend and part (property cases, serving traces,
  upstream specs), a divergence a failure holding its shrunk report;
- ``replays/``: the replay files of shrunk failures.

Exit status: 0 when every case agreed with the oracle and at least ``--min-reached`` cases
reached the backend; 1 on a divergence (or too few cases reached); 2 when the check could not
run (no binary, an adapter that does not start, a usage error).

Every option has an environment variable of the same name (``ATTN_DIFF_BACKEND``, ...), which
is how the composite action passes its inputs without pasting them into a shell script.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any, Dict, List, Optional, Sequence
from xml.sax.saxutils import escape, quoteattr

from attn_diff_adapter import testing

PARTS = (("property", "property cases"), ("traces", "serving traces"), ("upstream", "upstream specs"))


def _env(name: str, default: str = "") -> str:
    return os.environ.get("ATTN_DIFF_" + name.upper().replace("-", "_"), default)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m attn_diff_adapter.ci", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=_env("backend"), help="a vLLM backend class, module:Class (or a registry name)")
    p.add_argument("--file", default=_env("file"), help="with --backend CLASS: the Python file defining it")
    p.add_argument("--adapter", default=_env("adapter"), help="an adapter command (shell words)")
    p.add_argument("--name", default=_env("name", "plugin"), help="the adapter's name in reports")
    p.add_argument("--cases", type=int, default=int(_env("cases", "300")))
    p.add_argument("--traces", type=int, default=int(_env("traces", "20")))
    p.add_argument("--seed", type=int, default=int(_env("seed", "1")))
    p.add_argument(
        "--only",
        action="append",
        default=[x for x in _env("only").replace(",\n", "\n").split("\n") if x.strip()] or None,
        help="KEY=VALUES narrowing (repeatable; the env variable takes one per line)",
    )
    p.add_argument("--args", default=_env("args"), help="more `attn-diff check` options (shell words)")
    p.add_argument("--adapter-args", default=_env("adapter_args"), help="with --backend: options of vllm_backend.py")
    p.add_argument("--python", default=_env("python"), help="with --backend: the interpreter the adapter runs in")
    p.add_argument("--min-reached", type=int, default=int(_env("min_reached", "1")))
    p.add_argument("--out", default=_env("out", "attn-diff-out"), help="where the summaries and replay files go")
    ns = p.parse_args(argv)
    if bool(ns.backend) == bool(ns.adapter):
        p.error("give exactly one of --backend (a vLLM backend class) and --adapter (a command)")
    return ns


def run(ns: argparse.Namespace) -> int:
    out = os.path.abspath(ns.out)
    replays = os.path.join(out, "replays")
    os.makedirs(replays, exist_ok=True)
    env: Dict[str, str] = {}
    if ns.backend:
        command: List[str] = testing.vllm_backend_command(
            ns.backend,
            file=ns.file or None,
            python=ns.python or None,
            extra=shlex.split(ns.adapter_args),
        )
        # The adapter imports the plugin from the working directory (the repository's root).
        env["PYTHONPATH"] = os.pathsep.join(
            [os.getcwd(), testing._package_dir()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
    else:
        command = shlex.split(ns.adapter)
    try:
        result = testing.run_check(
            command,
            name=ns.name,
            cases=ns.cases,
            traces=ns.traces,
            only=ns.only,
            seed=ns.seed,
            args=shlex.split(ns.args),
            env=env,
            out_dir=replays,
        )
    except (testing.BinaryNotFound, testing.BinaryVersionMismatch) as e:
        sys.stderr.write(f"attn-diff: {e}\n")
        return 2
    if result.summary is not None:
        with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(result.summary, f, indent=1)
    status = verdict(result, ns.min_reached)
    markdown = render_markdown(result, status, ns)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(markdown)
    with open(os.path.join(out, "junit.xml"), "w", encoding="utf-8") as f:
        f.write(render_junit(result, status))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(markdown + "\n")
    print(result.report() if result.summary is not None else (result.stdout + result.stderr)[-8000:])
    print(f"attn-diff: {STATUS_TEXT[status]}; summaries and replay files in {out}")
    return status


STATUS_TEXT = {0: "every case agreed with the oracle", 1: "divergence", 2: "the check could not run"}


def verdict(result: testing.CheckResult, min_reached: int) -> int:
    """0 passed, 1 diverged (or too few cases reached the backend), 2 could not run."""
    if result.summary is None:
        return 2 if result.returncode in (0, 2) else result.returncode
    if result.returncode != 0:
        return 1 if result.returncode == 1 else 2
    return 1 if result.reached < min_reached else 0


def _backends(result: testing.CheckResult) -> List[Dict[str, Any]]:
    return list((result.summary or {}).get("backends") or [])


def render_markdown(result: testing.CheckResult, status: int, ns: argparse.Namespace) -> str:
    target = f"`{ns.backend}`" if ns.backend else f"`{ns.adapter}`"
    icon = {0: "passed", 1: "**diverged**", 2: "**could not run**"}[status]
    lines = [f"### attn-diff check of {target}: {icon}", ""]
    if result.summary is None:
        tail = (result.stderr.strip() or result.stdout.strip())[-3000:]
        return "\n".join(lines + ["```text", tail, "```", ""])
    lines += [
        f"seed {result.summary.get('seed')}, {result.summary.get('cases')} property cases, "
        f"{result.summary.get('traces')} serving traces; {result.counts_line()}",
        "",
        "| backend | part | sent | passed | failed | declined |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for b in _backends(result):
        name = (b.get("backend") or {}).get("name", "?")
        for key, label in PARTS:
            t = b.get(key) or {}
            if not t.get("sent"):
                continue
            lines.append(
                f"| `{name}` | {label} | {t.get('sent', 0)} | {t.get('passed', 0)} | {t.get('failed', 0)} | {t.get('declined', 0)} |"
            )
    if status == 1 and result.reached < ns.min_reached and result.failed == 0:
        lines += ["", f"Only {result.reached} case(s) reached the backend; at least {ns.min_reached} wanted."]
    report = result.report()
    if result.failed:
        lines += ["", "<details open><summary>shrunk failures (replay files are in the job's artifact)</summary>", "",
                  "```text", report, "```", "", "</details>"]
    unsupported = result.unsupported_lines()
    if unsupported:
        lines += ["", "Declined: " + "; ".join(unsupported)]
    return "\n".join(lines) + "\n"


def render_junit(result: testing.CheckResult, status: int) -> str:
    cases: List[str] = []
    failures = 0
    if result.summary is None:
        failures = 1
        text = (result.stderr.strip() or result.stdout.strip())[-8000:]
        cases.append(
            '  <testcase classname="attn-diff" name="check">\n'
            f"    <error message={quoteattr(f'attn-diff exited {result.returncode}')}>{escape(text)}</error>\n"
            "  </testcase>"
        )
    for b in _backends(result):
        name = (b.get("backend") or {}).get("name", "?")
        texts = {key: [] for key, _ in PARTS}  # type: Dict[str, List[str]]
        for f in b.get("failures") or []:
            kind = (f.get("origin") or {}).get("kind", "property")
            part = "traces" if kind == "trace" else "upstream" if kind == "upstream" else "property"
            texts.setdefault(part, []).append(result._runnable(str(f.get("text", "")).rstrip()))
        for key, label in PARTS:
            t = b.get(key) or {}
            if not t.get("sent"):
                continue
            head = f'  <testcase classname={quoteattr("attn-diff." + name)} name={quoteattr(label)}>'
            if t.get("failed"):
                failures += 1
                msg = f"{t.get('failed')} of {t.get('sent')} {label} diverged"
                body = "\n\n".join(texts.get(key) or []) or msg
                cases.append(f"{head}\n    <failure message={quoteattr(msg)}>{escape(body)}</failure>\n  </testcase>")
            elif t.get("passed", 0) == 0:
                cases.append(f"{head}\n    <skipped message={quoteattr('every one declined')}/>\n  </testcase>")
            else:
                cases.append(f"{head}</testcase>")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="attn-diff" tests="{len(cases)}" failures="{failures}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


def main(argv: Optional[Sequence[str]] = None) -> None:
    raise SystemExit(run(parse_args(argv)))


if __name__ == "__main__":
    main()
