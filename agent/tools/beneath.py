"""Open a file beneath a directory without a check-then-use race.

``openat2(2)`` with ``RESOLVE_BENEATH`` (Linux 5.6+) lets the kernel refuse any resolution that leaves the
directory — a symlink to outside, or a directory swapped for one between a check and the open. Where it
does not exist, each component is opened in turn with ``O_NOFOLLOW`` from the previous directory's fd, so a
symlink anywhere on the path is refused.
"""

from __future__ import annotations

import ctypes
import errno
import os

_SYS_OPENAT2 = 437  # the same number on every Linux architecture (added with the unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class Outside(OSError):
    """The path leads outside the directory (through a symlink, or a directory swapped for one)."""


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()
_openat2_works = _LIBC is not None and hasattr(_LIBC, "syscall")


def open_beneath(root_fd: int, relative: str, flags: int, mode: int = 0) -> int:
    """An fd for ``relative`` (no ``..``, not absolute) under the directory ``root_fd``; raises Outside."""
    global _openat2_works  # noqa: PLW0603 - learnt once per process: the kernel has openat2 or not
    flags |= os.O_CLOEXEC
    if _openat2_works and _LIBC is not None:
        how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
        fd = int(_LIBC.syscall(_SYS_OPENAT2, root_fd, os.fsencode(relative), ctypes.byref(how), ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err == errno.EXDEV:
            raise Outside(err, "leads outside the repository", relative)
        if err not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter that does not know openat2
            raise OSError(err, os.strerror(err), relative)
        _openat2_works = False
    return _walk(root_fd, relative, flags, mode)


def _walk(root_fd: int, relative: str, flags: int, mode: int) -> int:
    """Component by component, never following a symlink."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    current = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            except OSError as exc:
                raise _symlink_is_outside(exc, relative) from exc
            os.close(current)
            current = following
        if not parts:
            return os.dup(current)
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW, mode, dir_fd=current)
        except OSError as exc:
            raise _symlink_is_outside(exc, relative) from exc
    finally:
        os.close(current)


def _symlink_is_outside(exc: OSError, relative: str) -> OSError:
    if exc.errno == errno.ELOOP:
        return Outside(exc.errno, "goes through a symlink (not followed without openat2)", relative)
    return exc
