"""``python -m attn_diff ARGS``: the installed attn-diff binary with ARGS."""

from __future__ import annotations

import os
import sys

from attn_diff import installed_binary


def main() -> None:
    exe = installed_binary()
    if exe is None:
        sys.stderr.write(
            "attn-diff: this attn-diff install carries no attn-diff binary "
            "(a source checkout, not an installed wheel): `pip install ./adapters/python` "
            "builds one, or run `cargo run -p attn-harness -- ...` in the checkout\n"
        )
        raise SystemExit(2)
    if os.name == "nt":
        import subprocess

        raise SystemExit(subprocess.call([exe, *sys.argv[1:]]))
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
