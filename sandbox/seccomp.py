"""The sandbox's seccomp filter: the kernel's keyrings are out of the agent's reach (issue 36).

A sandboxed command would otherwise share the worker's session keyring (listed, keys added) and its user's
keyring, which outlives the task and is shared with every other task of the same user. A new session keyring per
call would still leave the user's; the filter refuses ``add_key``, ``request_key`` and ``keyctl`` altogether (EPERM),
as Docker's default profile does. A classic BPF program, written by hand: a few instructions, no library.

It checks the calling convention (``seccomp_data.arch``) first, since a 64-bit process may also make 32-bit calls
(``int 0x80`` on x86-64, with other numbers) or x32 calls (numbers with bit 30 set): each gets its own numbers, x32
is refused whole, and an architecture not listed is allowed (this host cannot run it).
"""

from __future__ import annotations

import errno
import functools
import os
import struct
import tempfile
from pathlib import Path

# (AUDIT_ARCH_*, the numbers of add_key, request_key and keyctl in that convention)
KEYRING_CALLS = (
    (0xC000003E, (248, 249, 250)),  # x86-64
    (0x40000003, (286, 287, 288)),  # i386 (int 0x80 on x86-64)
    (0xC00000B7, (217, 218, 219)),  # aarch64
    (0x40000028, (309, 310, 311)),  # arm (aarch32 on aarch64)
)
X32_BIT = 0x40000000  # x86-64's x32 calls: refused whole
_X86_64 = 0xC000003E
_LD_W_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW = 0x7FFF0000
_DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def program() -> bytes:
    """The filter as ``struct sock_filter`` records, what bubblewrap's ``--seccomp FD`` reads."""
    code: list[tuple[int, int | None, int, int]] = [(_LD_W_ABS, 0, 0, _ARCH)]  # jt None: to the refusal
    for arch, numbers in KEYRING_CALLS:
        block: list[tuple[int, int | None, int, int]] = [(_LD_W_ABS, 0, 0, _NR)]
        if arch == _X86_64:
            block.append((_JGE, None, 0, X32_BIT))
        block += [(_JEQ, None, 0, number) for number in numbers]
        block.append((_RET, 0, 0, _ALLOW))
        code.append((_JEQ, 0, len(block), arch))  # another convention: skip this block
        code += block
    code.append((_RET, 0, 0, _ALLOW))
    deny = len(code)
    code.append((_RET, 0, 0, _DENY))
    return b"".join(
        struct.pack("=HBBI", op, deny - index - 1 if jt is None else jt, jf, k)
        for index, (op, jt, jf, k) in enumerate(code)
    )


@functools.cache
def filter_file() -> Path:
    """The program in a file of this process's own (0644 in a 0755 directory: whoever the sandbox starts as can
    open it, nobody else can change it), written once."""
    directory = Path(tempfile.mkdtemp(prefix="tasuki-seccomp-"))
    path = directory / "keyrings.bpf"
    path.write_bytes(program())
    path.chmod(0o644)
    os.chmod(directory, 0o755)  # noqa: S103 - a program, not a secret: the dropped user must read it
    return path
