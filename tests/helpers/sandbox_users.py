"""Users for the sandbox's tests: the dedicated sandbox user a root worker drops to, and a test user an unprivileged
worker runs as (the tests make them; both need the test process to be root, else the test skips, failing in CI).

``run_as(user, argv)`` runs a program as that user through util-linux's ``setpriv`` (no supplementary groups), and
:func:`python_as` gives the interpreter line that runs this repository's code as a user who cannot reach the
virtualenv's own interpreter (a pyenv Python under ``/root``, mode 0700): the system's ``python3`` of the same version
with the repository and the virtualenv's site-packages on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.helpers.ci import cannot_run

REPOSITORY = Path(__file__).resolve().parents[2]
SETPRIV = "/usr/bin/setpriv"
SANDBOX_USER = "tasuki-sandbox"  # sandbox.user's default
WORKER_USER = "tasuki-test-worker"  # an unprivileged worker's user in the tests


def need_root() -> None:
    """Skip the test (fail it in CI) unless it runs as root: making users and dropping to them needs it."""
    if os.geteuid() != 0:
        cannot_run("the test makes users and runs programs as them: it needs root")


def ensure_user(name: str) -> tuple[int, int]:
    """``name``'s (uid, gid), made a system user with its own group and no home first if it does not exist."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        need_root()
        useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")
        if useradd is None:
            cannot_run("useradd (passwd) is not installed")
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def as_user(name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` behind ``setpriv`` as ``name`` (made if missing): its uid and group, no supplementary groups."""
    uid, gid = ensure_user(name)
    return [SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]


def run_as(name: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as the user ``name`` (see :func:`as_user`); ``kwargs`` go to ``subprocess.run`` (text output,
    captured, unchecked unless said)."""
    need_root()
    options: dict[str, Any] = {"capture_output": True, "text": True, "check": False, **kwargs}
    return subprocess.run(as_user(name, argv), **options)  # noqa: PLW1510 - check is in options


def owned_dir(name: str, prefix: str = "tasuki-user-") -> Path:
    """A new empty directory under the system's temporary directory (every user can pass /tmp), owned by ``name``,
    mode 0700. The caller removes it (``shutil.rmtree`` as root)."""
    uid, gid = ensure_user(name)
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # every user can pass /tmp
    os.chown(directory, uid, gid)
    return directory


def give(path: Path, name: str) -> None:
    """``path`` and everything below it owned by ``name`` (symlinks themselves, never what they point to)."""
    uid, gid = ensure_user(name)
    os.lchown(path, uid, gid)
    for root, dirnames, filenames in os.walk(path):
        for entry in (*dirnames, *filenames):
            os.lchown(os.path.join(root, entry), uid, gid)


def python_as(name: str) -> tuple[list[str], dict[str, str]]:
    """The interpreter line that runs this repository's code as ``name``, and the environment it needs (PATH,
    PYTHONPATH). The test's own interpreter when that user can run it, else the system's ``python3`` of the same
    version with the repository and the virtualenv's site-packages on PYTHONPATH."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    paths = [str(REPOSITORY), *site.getsitepackages()]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    _let_through(name, [*paths, str(REPOSITORY / "tests")])
    probe = [sys.executable, "-c", "import sys"]
    if run_as(name, probe).returncode == 0:
        return [sys.executable], env
    system = "/usr/bin/python3"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    told = run_as(name, [system, "-c", "import sys; print(f'{sys.version_info.major}.{sys.version_info.minor}')"])
    if told.returncode != 0 or told.stdout.strip() != version:
        cannot_run(f"no Python {version} that {name} can run (the test's own is out of its reach)")
    return [system], env


def _let_through(name: str, paths: Sequence[str]) -> None:
    """Let ``name`` pass the directories on the way to ``paths``: a clone in a 0700 directory (CI's ``mktemp -d``)
    would otherwise keep the repository's code from the user the test runs it as. As the worker lets its sandbox's
    user through to what bubblewrap binds: an ACL entry naming that user alone, on directories the test's user owns."""
    from sandbox import confine

    uid, gid = ensure_user(name)
    confine.let_through(paths, confine.SandboxUser(name, uid, gid))


def environment(extra: Mapping[str, str] | None = None, *, name: str) -> dict[str, str]:
    """:func:`python_as`'s environment for ``name`` with ``extra`` added."""
    return {**python_as(name)[1], **(extra or {})}


def handed_over_task(root: Path) -> tuple[Path, Path]:
    """A checkout and a home under ``root``, handed over to the sandbox's user as the worker does when a task begins
    (when the test runs as root; else they are the test's own)."""
    from sandbox import confine

    checkout, home = root / "checkout", root / "home"
    checkout.mkdir()
    home.mkdir()
    user = confine.sandbox_user(SANDBOX_USER) if os.geteuid() == 0 else None
    confine.hand_over(checkout, user)
    confine.hand_over(home, user)
    return checkout, home
