"""The checkout the agent works in, and the rule that keeps every tool path inside it."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from agent.tools.beneath import Outside, open_beneath
from contexts.errors import TasukiError


class ToolError(TasukiError):
    """A tool refused or failed; the one-line message is shown to the model."""


class Workspace:
    """A checkout directory; :meth:`resolve` maps the model's relative paths to real paths inside it."""

    def __init__(self, root: Path) -> None:
        # Compare against the real path so that a root reached through a symlink still contains itself.
        self.root = Path(os.path.realpath(root))

    def resolve(self, path: str) -> Path:
        """Return the real path of ``path`` (relative to the checkout), or raise ToolError if it leaves it."""
        if not path:
            raise ToolError("path is empty; give a path relative to the repository root")
        if "\x00" in path:
            raise ToolError("path contains a NUL byte")
        try:
            os.fsencode(path)
        except UnicodeEncodeError as exc:
            raise ToolError(f"path is not valid Unicode ({exc.reason})") from exc
        if path.startswith("/"):
            raise ToolError(f"absolute paths are not allowed ({path!r}); give a path relative to the repository root")
        if ".." in path.split("/"):
            raise ToolError(f"'..' is not allowed in paths ({path!r})")
        if ".git" in path.split("/"):
            raise ToolError(f"paths under .git are not for the file tools ({path!r}); use git through bash")
        # realpath follows every symlink, also dangling ones and symlinked parent directories, so a
        # link pointing out of the checkout resolves outside it and is refused below.
        candidate = self.root / path
        real = Path(os.path.realpath(candidate))
        if not real.is_relative_to(self.root):
            raise ToolError(f"{path!r} resolves outside the repository through a symlink")
        try:
            os.stat(candidate)
        except OSError as exc:
            # realpath gives up silently on a loop; writing would then replace the link with a file.
            if exc.errno == errno.ELOOP:
                raise ToolError(f"{path!r} is a loop of symlinks") from exc
        return real

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        """An fd for ``path`` opened by the kernel beneath the checkout (no check-then-use race with a
        directory swapped for a symlink meanwhile); the path is checked like :meth:`resolve` first."""
        self.resolve(path)
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return open_beneath(root_fd, path, flags, mode)
        except Outside as exc:
            raise ToolError(f"{path!r} resolves outside the repository through a symlink") from exc
        finally:
            os.close(root_fd)

    def open_parent(
        self, path: str, *, create: bool, owner: tuple[int, int] | None = None
    ) -> tuple[int, str]:
        """The directory fd that holds ``path``'s last component (made, with its parents, when ``create``; each
        directory made given to ``owner``, the sandbox's user of a root worker), opened beneath the checkout; and
        that component's name."""
        self.resolve(path)
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if not parts:
            raise ToolError(f"{path!r} names the repository root, not a file")
        current = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=current)
                        if owner is not None:  # the agent's commands write in it next
                            os.chown(part, *owner, dir_fd=current, follow_symlinks=False)
                try:
                    following = open_beneath(current, part, os.O_RDONLY | os.O_DIRECTORY)
                except Outside as exc:
                    raise ToolError(f"{path!r} resolves outside the repository through a symlink") from exc
                except NotADirectoryError as exc:
                    raise ToolError(f"cannot create the parent directory of {path}: a file is in the way") from exc
                os.close(current)
                current = following
        except BaseException:
            os.close(current)
            raise
        return current, parts[-1]

    def display(self, real: Path) -> str:
        """The path relative to the checkout, as the model should see it."""
        return real.relative_to(self.root).as_posix()
