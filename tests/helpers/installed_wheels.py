"""Real wheels of distributions installed in this virtualenv, for the local package index (package_index.py): a
sandboxed pip installs the real pytest, offline, from files this process already has.

A wheel is rebuilt from the installed files that the distribution's RECORD lists (``importlib.metadata``), minus
what installing made (byte code, scripts outside site-packages, INSTALLER, direct_url.json), with a RECORD and a WHEEL
of its own. Pure-Python distributions only (every one pytest needs is).
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from tests.helpers.package_index import PackageIndex

PYTEST_AND_DEPENDENCIES = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
FREEZEGUN_AND_DEPENDENCIES = ("freezegun", "python-dateutil", "six")  # some of itsdangerous's tests freeze time
_SKIPPED_INFO = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "WHEEL"})


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def installed_wheel(name: str, directory: Path) -> Path:
    """A ``py3-none-any`` wheel of the installed distribution ``name``, written into ``directory``."""
    dist = metadata.distribution(name)
    project = re.sub(r"[-.]+", "_", dist.metadata["Name"]).lower()
    version = dist.version
    info = f"{project}-{version}.dist-info"
    contents: dict[str, bytes] = {}
    for file in dist.files or ():
        parts = file.parts
        if ".." in parts or "__pycache__" in parts or file.suffix == ".pyc":
            continue
        if parts[0].endswith(".dist-info"):
            if parts[-1] in _SKIPPED_INFO:
                continue
            target = "/".join((info, *parts[1:]))
        else:
            target = "/".join(parts)
        contents[target] = Path(str(file.locate())).read_bytes()
    contents[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: tasuki-tests\nRoot-Is-Purelib: true\n"
                                 b"Tag: py3-none-any\n")
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in contents.items()]
    contents[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{project}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in contents.items():
            archive.writestr(path, data)
    return wheel


def serve_installed(index: PackageIndex, directory: Path, names: Iterable[str] = PYTEST_AND_DEPENDENCIES) -> None:
    """Serve wheels of the installed ``names`` (default: pytest and what it needs) from ``index``."""
    for name in names:
        index.add(installed_wheel(name, directory))
