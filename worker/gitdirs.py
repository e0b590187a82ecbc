"""The worker's own git on a task's checkout, and the agent's: two git directories for one working tree.

The checkout's ``.git`` is the agent's: it writes it from inside the sandbox, and git reads a repository's files as
instructions (``.git/config`` names filters, credential helpers, pagers, an ``sshCommand``, push URLs;
``include.path`` pulls in any file; ``info/attributes`` applies drivers; ``commondir``, a ``gitdir:`` file and
``objects/info/alternates`` point at other repositories). The worker's git runs on the host with the forge
credential in its environment, so it never reads that directory: every one of its commands runs with ``GIT_DIR`` set
to a git directory of the worker's own, ``{workspaces_dir}/{uuid}.git`` (:func:`sandbox.setup.worker_git_dir`:
beside the checkout, bound into no sandbox, mode 0700), and ``GIT_WORK_TREE`` set to the checkout. What it reads of
the checkout is the working tree's files, as content: a ``.gitattributes`` line can name a filter, diff or merge
driver, but the worker's ``info/attributes`` (which outranks every ``.gitattributes``) unsets all three for every
path, so none runs, even one the host's system or user config defines (git-lfs installed there defines its filter).
Git's own recursion into nested repositories (a ``sub/.git`` the agent made has a config of its own) is off on every
call (:data:`SAFE_GIT`).

The agent's ``.git`` is written by the worker whenever it changes the tree (:func:`show_agent`): made whole in a
fresh directory and renamed into place, never written through anything the agent left there. What comes back from it
— the commits the agent made, the paths it staged or unstaged — is read by git inside a jail of its own
(:func:`jailed_git`): bubblewrap with nothing but the checkout and its object mirror, read-only, no network, an
empty environment. ``upload-pack`` (git's own answer for reading an untrusted repository) sends the agent's commits
to the worker's git as a pack, which the worker's side checks object by object (``index-pack``); an alternates file
or a symlink the agent planted can only name what the jail holds, which is what its sandbox sees anyway.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from contexts.errors import TasukiError
from sandbox import confine
from sandbox.host import HOST_ENV, program
from sandbox.jail import SYSTEM_DIRS

log = structlog.get_logger(__name__)

AUTHOR = {
    "GIT_AUTHOR_NAME": "Tasuki",
    "GIT_AUTHOR_EMAIL": "tasuki@localhost",
    "GIT_COMMITTER_NAME": "Tasuki",
    "GIT_COMMITTER_EMAIL": "tasuki@localhost",
}

# On every call of the worker's git, whatever a config file says: no hooks, no fsmonitor command, no recursion into a
# nested repository (whose own config would be read: `fetch` and `status` run git inside each submodule). A root
# worker's checkouts belong to the sandbox's user (sandbox.confine): its git works in them all the same.
SAFE_GIT = (
    "-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", "-c", "safe.directory=*",
    "-c", "submodule.recurse=false", "-c", "fetch.recurseSubmodules=false", "-c", "push.recurseSubmodules=no",
    "-c", "protocol.ext.allow=never",
)
# The git directory's info/attributes outranks every .gitattributes of the tree: no driver for any path.
NO_DRIVERS = "* !filter !diff !merge\n"
AGENT_HEAD_REF = "refs/tasuki/agent-head"  # in the worker's git directory: the agent's HEAD as last taken
AGENT_GIT_TIMEOUT_S = 600.0  # a jailed read of the agent's repository (a FIFO in .git would hold it forever)
_LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
# Inside the jail only: the agent's repository may be the sandbox user's, seen from the worker's uid.
_JAILED_CONFIG = ("-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}")


class GitError(TasukiError):
    """A git command failed; the message holds the command and git's last line of output."""


def run_git(
    args: tuple[str, ...], *, cwd: Path, extra_env: Mapping[str, str] | None = None, check: bool = True,
    stdin: str | None = None, timeout_s: float | None = None,
) -> str:
    """Run git with a fixed author and no terminal prompts; raise :class:`GitError` on failure (and at ``timeout_s``,
    when given: the command and whatever it started are killed)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    env.update(AUTHOR)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.update(extra_env or {})
    with subprocess.Popen(["git", *SAFE_GIT, *args], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=timeout_s is not None) as proc:
        try:
            stdout, stderr = proc.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise GitError(f"git {args[0]} failed: no answer in {timeout_s:.0f} s") from None
    if check and proc.returncode != 0:
        last = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        raise GitError(f"git {args[0]} failed: {last[0]}")
    return stdout


def tree_env(git_dir: Path, checkout: Path) -> dict[str, str]:
    """The environment that points git at the worker's git directory with ``checkout`` as its working tree (no
    discovery: the checkout's own ``.git`` is never looked at)."""
    return {"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(checkout)}


def default_branch(mirror: Path) -> str:
    """The branch the mirror's ``HEAD`` names (the remote's default when it was cloned)."""
    return (mirror / "HEAD").read_text().strip().removeprefix("ref: refs/heads/")


def mirror_heads(mirror: Path) -> dict[str, str]:
    """The mirror's branches: name -> commit; ``HEAD`` too (the remote's default branch)."""
    listed = run_git(("for-each-ref", "--format=%(objectname) %(refname:lstrip=2)", "refs/heads"), cwd=mirror)
    heads = {name: sha for sha, name in (line.split(" ", 1) for line in listed.splitlines() if " " in line)}
    default = heads.get(default_branch(mirror))
    return {**heads, "HEAD": default} if default else heads


def _config(remote: str) -> str:
    url = remote.replace("\\", "\\\\").replace('"', '\\"')
    return (
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = false\n"
        f'[remote "origin"]\n\turl = "{url}"\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n'
    )


def write_repository(git_dir: Path, remote: str, mirror: Path, heads: Mapping[str, str],
                     own: Mapping[str, str]) -> None:
    """A git directory at ``git_dir`` (empty or missing) written as files (git's repository format), not by git:
    objects through the mirror, ``origin`` the real remote, ``heads`` as ``origin/*``, ``own`` as ``refs/heads/*``
    with HEAD on the first (else on the mirror's default branch); no filter, diff or merge driver for any path
    (:data:`NO_DRIVERS`). No reflogs: nobody reads them."""
    for directory in ("objects/info", "refs/remotes/origin", "refs/heads", "info"):
        (git_dir / directory).mkdir(parents=True)
    (git_dir / "config").write_text(_config(remote))
    (git_dir / "info" / "attributes").write_text(NO_DRIVERS)
    (git_dir / "objects" / "info" / "alternates").write_text(f"{mirror / 'objects'}\n")
    refs = {f"refs/remotes/origin/{name}": sha for name, sha in heads.items() if name != "HEAD"}
    refs.update({f"refs/heads/{name}": sha for name, sha in own.items()})
    packed = "".join(f"{sha} {ref}\n" for ref, sha in sorted(refs.items()))
    (git_dir / "packed-refs").write_text(f"# pack-refs with: peeled fully-peeled sorted \n{packed}")
    default = default_branch(mirror)
    (git_dir / "refs" / "remotes" / "origin" / "HEAD").write_text(f"ref: refs/remotes/origin/{default}\n")
    (git_dir / "HEAD").write_text(f"ref: refs/heads/{next(iter(own), default)}\n")


def new_worker_git_dir(git_dir: Path, remote: str, mirror: Path, heads: Mapping[str, str]) -> None:
    """Make the worker's git directory of a task anew (0700; whatever was at its path is deleted first)."""
    if git_dir.is_dir() and not git_dir.is_symlink():
        shutil.rmtree(git_dir)
    elif git_dir.exists() or git_dir.is_symlink():
        git_dir.unlink()
    git_dir.mkdir(mode=0o700, parents=True)
    try:
        write_repository(git_dir, remote, mirror, heads, {})
    except BaseException:
        shutil.rmtree(git_dir, ignore_errors=True)
        raise


def show_agent(checkout: Path, git_dir: Path, remote: str, mirror: Path) -> None:
    """Give the agent a ``.git`` in ``checkout`` that shows the worker's state: its branch at the worker's HEAD, the
    worker's ``index`` (the agent's git finds the tree unchanged without hashing it) and ``info/exclude``. Made whole
    in a directory of a fresh name, then renamed over whatever the agent left at ``.git`` (removed first, never
    followed): nothing is written through a link of the agent's."""
    branch = (git_dir / "HEAD").read_text().strip().removeprefix("ref: refs/heads/")
    head = run_git(("rev-parse", "-q", "--verify", "HEAD"), cwd=checkout, extra_env=tree_env(git_dir, checkout),
                   check=False).strip()
    heads = dict(zsplit_refs(run_git(("for-each-ref", "--format=%(objectname) %(refname:lstrip=3)",
                                      "refs/remotes/origin"), cwd=checkout, extra_env=tree_env(git_dir, checkout))))
    fresh = checkout / f".tasuki-git-{secrets.token_hex(8)}"
    fresh.mkdir(mode=0o755)  # a fresh name: fails rather than follow anything the agent left
    try:
        write_repository(fresh, remote, mirror, heads, {branch: head} if head else {})
        for name in ("index", "info/exclude"):
            with contextlib.suppress(FileNotFoundError):
                shutil.copyfile(git_dir / name, fresh / name)
        _remove(checkout / ".git")
        os.rename(fresh, checkout / ".git")
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def zsplit_refs(listed: str) -> list[tuple[str, str]]:
    """``for-each-ref`` lines of ``%(objectname) %(refname…)`` as (name, commit) pairs."""
    return [(name, sha) for sha, name in (line.split(" ", 1) for line in listed.splitlines() if " " in line)]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # never follows a link (fd-based on Linux)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_beneath(top: Path, parts: Sequence[str], data: bytes) -> bool:
    """Write ``data`` at ``top/parts...`` as a new file renamed into place, each directory on the way opened without
    following links (a missing one is made): a link the agent left in its ``.git`` is replaced, never written through.
    False (logged) when the way is blocked."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        temporary = f".tasuki-{secrets.token_hex(8)}"
        out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        with os.fdopen(out, "wb") as handle:
            handle.write(data)
        os.rename(temporary, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
        return True
    except OSError as exc:
        log.warning("the agent's git directory not updated", path="/".join(parts), error=str(exc)[:200])
        return False
    finally:
        os.close(fd)


def jailed_git(checkout: Path, shared: Sequence[Path]) -> list[str]:
    """The command line of a git that reads the agent's repository in ``checkout`` in a jail: bubblewrap with the
    system directories, ``checkout`` and ``shared`` (its object mirror) read-only at their own paths and nothing else,
    no network, no capability, an empty environment; as the checkout's owner (a root worker's sandbox user)."""
    bwrap = program("bwrap")
    git = program("git")
    if bwrap is None or git is None:
        raise GitError("git or bubblewrap not found: the agent's repository cannot be read safely")
    argv: list[str] = []
    owner = os.stat(checkout)
    if os.geteuid() == 0 and owner.st_uid != 0:
        user = confine.SandboxUser(str(owner.st_uid), owner.st_uid, owner.st_gid)
        confine.let_through([str(checkout), *map(str, shared)], user)
        setpriv = program("setpriv") or "/usr/bin/setpriv"
        argv += [setpriv, f"--reuid={owner.st_uid}", f"--regid={owner.st_gid}", "--clear-groups", "--"]
    argv += [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
             "--setenv", "PATH", HOST_ENV["PATH"], "--setenv", "LANG", "C.UTF-8", "--proc", "/proc", "--dev", "/dev"]
    for path in (*SYSTEM_DIRS, *_LOADER_FILES):
        argv += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind-try", path, path]
    for bound in (checkout, *shared):
        argv += ["--ro-bind", str(bound), str(bound)]
    return [*argv, "--chdir", str(checkout), "--", git, *_JAILED_CONFIG]


def take_agent_head(git_dir: Path, checkout: Path, shared: Sequence[Path]) -> str | None:
    """Fetch the agent's HEAD commit (and what it needs) from the checkout's ``.git`` into the worker's git directory,
    through ``upload-pack`` in the jail, without the forge's credential; the commit, or None when the agent's
    repository gives none (it broke it, or its HEAD is unborn)."""
    upload_pack = shlex.join([*jailed_git(checkout, shared), "upload-pack"])
    try:
        run_git(("fetch", "-q", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules",
                 f"--upload-pack={upload_pack}", f"file://{checkout}/.git", f"+HEAD:{AGENT_HEAD_REF}"),
                cwd=checkout, extra_env=tree_env(git_dir, checkout), timeout_s=AGENT_GIT_TIMEOUT_S)
    except GitError as exc:
        log.warning("the agent's commits could not be read; the work is committed on the worker's branch",
                    error=str(exc)[:300])
        return None
    return run_git(("rev-parse", "--verify", f"{AGENT_HEAD_REF}^{{commit}}"), cwd=checkout,
                   extra_env=tree_env(git_dir, checkout)).strip()


def agent_index_paths(checkout: Path, shared: Sequence[Path]) -> set[str] | None:
    """The paths the agent's index holds (what it staged, minus what it unstaged), read by git in the jail: data, never
    the agent's files themselves. None when its repository cannot say."""
    argv = [*jailed_git(checkout, shared), "ls-files", "-z"]
    try:
        done = subprocess.run(argv, env=dict(HOST_ENV), capture_output=True, timeout=AGENT_GIT_TIMEOUT_S, check=False,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        log.warning("the agent's index could not be read", error=done.stderr.decode(errors="replace")[-300:])
        return None
    return {name for name in done.stdout.decode("utf-8", errors="surrogateescape").split("\0") if name}
