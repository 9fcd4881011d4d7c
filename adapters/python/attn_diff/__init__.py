"""The attn-diff binary this package installs, and its version.

``pip install`` builds ``attn-diff`` (the cpu backend, external backends and the mutants; no
libtorch) into the environment's scripts directory beside the Python files, so
``attn-diff …``, ``python -m attn_diff …`` and the pytest helper all run that binary.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import List, Optional

#: The distribution that carries the binary (named attn-diff-adapter before 0.1.0 was
#: published; the import names `attn_diff` and `attn_diff_adapter` are unchanged).
DISTRIBUTION = "attn-diff"


def _version() -> str:
    """The version, written in one place: the workspace's Cargo.toml ([workspace.package]),
    which maturin puts into the wheel's metadata. An install reads its metadata; a checkout
    reads Cargo.toml itself."""
    here = os.path.dirname(os.path.abspath(__file__))
    cargo = os.path.join(here, "..", "..", "..", "Cargo.toml")
    if os.path.isfile(cargo) and os.path.isfile(os.path.join(here, "..", "pyproject.toml")):
        import re

        with open(cargo, encoding="utf-8") as f:
            found = re.search(r'\[workspace\.package\][^\[]*?\nversion = "([^"]+)"', f.read())
        if found:
            return found.group(1)
    try:
        from importlib import metadata

        return metadata.version(DISTRIBUTION)
    except Exception:  # neither a checkout nor an install: unknown
        return "0+unknown"


#: The package's version, which is the binary's (the workspace version in Cargo.toml): the
#: helper refuses a binary that reports another.
__version__ = _version()

_EXE = "attn-diff.exe" if os.name == "nt" else "attn-diff"


def _candidates() -> List[str]:
    found: List[str] = []
    try:
        from importlib import metadata

        dist = metadata.distribution(DISTRIBUTION)
        for entry in dist.files or []:
            if entry.name == _EXE:
                found.append(os.path.abspath(str(dist.locate_file(entry))))
    except Exception:  # not installed (a checkout): no installed binary
        pass
    # The scripts directory of this interpreter's environment (a venv's bin/), where pip puts
    # the binary; covers an install whose RECORD lacks it.
    for scheme_dir in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        if scheme_dir:
            found.append(os.path.join(scheme_dir, _EXE))
    return found


def installed_binary() -> Optional[str]:
    """The attn-diff binary installed with this package, or None when there is none (a
    checkout, or an install without the binary)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in _candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            # Only a binary of this installation: a checkout imported from its source tree
            # while some other environment is active must not pick that environment's up.
            if _same_install(here, path):
                return path
    return None


def _same_install(package_dir: str, binary: str) -> bool:
    """Whether `binary` belongs to the environment `package_dir` was installed into: the
    package is under that environment's prefix (site-packages), not a source checkout."""
    for prefix in {sys.prefix, sys.base_prefix, sysconfig.get_config_var("userbase") or ""}:
        if prefix and package_dir.startswith(os.path.abspath(prefix) + os.sep) and binary.startswith(
            os.path.abspath(prefix) + os.sep
        ):
            return True
    return False
