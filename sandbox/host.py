"""How the worker starts the host-side processes of a sandboxed call (issue 36).

prlimit, bubblewrap and the rest run on the host, outside every namespace, with the worker's rights: nothing the
agent wrote may steer them. They start with this fixed environment (never the command's: its variables reach only
the command inside, through bubblewrap's ``--clearenv`` and ``--setenv``) and by absolute paths in the system
directories, never looked up on a ``PATH`` the agent could extend.
"""

from __future__ import annotations

import functools
import shutil

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
HOST_ENV = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


@functools.cache
def program(name: str) -> str | None:
    """``name``'s absolute path in the system directories (``/usr/local/bin`` too), or None."""
    return shutil.which(name, path=f"/usr/local/sbin:/usr/local/bin:{SYSTEM_PATH}")


def host_env() -> dict[str, str]:
    """A copy of the fixed environment host-side processes start with."""
    return dict(HOST_ENV)
