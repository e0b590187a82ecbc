"""The agent's shell is an attacker's shell (issue 36): each escape of the hostile-task trial, tried again through the
real ``bash`` tool as a worker runs it, in both worker set-ups — root (as in CI) and an unprivileged user the tests
make — plus what held then, as regression tests, and attacks of our own on the seams issue 36 added.

Every attack aims at something only the host has: a "canary" directory outside the task (a secret file, an env file
of the worker's, a directory whose mode must not change). The sandbox never sees it; an attack that wins leaves a
mark there, or prints what it holds. Each test here failed on 8da9827 (the trial's main), but those marked "held".
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox import envfiles, homefiles, layers
from sandbox.jail import Bubblewrap
from sandbox.settings import SandboxSettings
from tests.helpers import hostile_agent
from tests.helpers.ci import bubblewrap_here
from tests.helpers.loopback_service import serve_text
from tests.helpers.sandbox_users import SANDBOX_USER, WORKER_USER, give, need_root

SECRET = "canary-secret-5e1f0c2a"
CANARY_MODE = 0o755


@dataclass
class Task:
    """One task's checkout and home, the worker's user, and the host-only canary."""

    checkout: Path
    home: Path
    canary: Path
    user: str | None

    def agent(self, *commands: str, remove_home: bool = False) -> list[str]:
        return hostile_agent.run(self.checkout, self.home, commands, user=self.user, remove_home=remove_home)

    def restore(self, lower: Path) -> None:
        """Lay ``lower``'s ``.venv`` over the checkout, as a restore by layers does. A snapshot's files are those of
        whoever ran its setup: the worker's user, or a root worker's sandbox user (``cp -a`` keeps owners)."""
        owner = self.user or (SANDBOX_USER if os.geteuid() == 0 else None)  # else the test's user: its own already
        if owner is not None:
            give(lower, owner)
        layers.lay(self.home, self.checkout, lower, [".venv"])
        if self.user is not None:
            give(layers.layers_dir(self.home), self.user)
            give(self.checkout, self.user)

    def untouched(self) -> bool:
        """The canary as the test made it: its mode, its files, nothing added."""
        names = sorted(p.name for p in self.canary.iterdir())
        mode = stat.S_IMODE(self.canary.stat().st_mode)
        return names == ["secret.env", "secret.txt"] and mode == CANARY_MODE


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    bubblewrap_here()


@pytest.fixture(params=["root", "unprivileged"])
def task(request: pytest.FixtureRequest) -> Iterator[Task]:
    user = None if request.param == "root" else WORKER_USER
    if user is not None and os.geteuid() != 0:
        # "root" is the test's own user: an unprivileged one here, so that case is this one, as itself (the other
        # needs root to make and become the worker's user).
        pytest.skip("the test runs unprivileged: its [root] case is the unprivileged worker")
    if user is not None or os.geteuid() == 0:
        need_root()
    base = Path(tempfile.mkdtemp(prefix="tasuki-hostile-", dir="/tmp"))
    os.chmod(base, 0o755)  # noqa: S103 - the worker's user passes through it
    task = Task(base / "task" / "checkout", base / "task" / "checkout.home", base / "canary", user)
    task.checkout.mkdir(parents=True)
    (task.checkout / "README.md").write_text("hello\n")
    task.home.mkdir(mode=0o700)
    task.canary.mkdir()
    (task.canary / "secret.txt").write_text(f"{SECRET}\n")
    (task.canary / "secret.env").write_text(f"DATABASE_URL=postgres://fleet:{SECRET}@db/fleet\n")
    if user is not None:
        give(base, user)
    os.chmod(task.canary, CANARY_MODE)
    yield task
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(layers.layers_dir(task.home), ignore_errors=True)


HOST_HOME = "$(awk '$5 == \"/tmp/home\" {print $4}' /proc/self/mountinfo)"  # row 14: the home's host path


def _compiled(name: str, source: str, *flags: str) -> str:
    """Shell lines that write ``source`` (C) to ``$HOME/name.c`` through a quoted here-document (no quoting to get
    wrong) and compile it to ``$HOME/name`` with ``flags``; "compiled" once done."""
    compile_it = f"gcc {' '.join(flags)} -o $HOME/{name} $HOME/{name}.c && echo compiled"
    return f"cat > $HOME/{name}.c <<'EOF_C'\n{source}\nEOF_C\n{compile_it}"


def _lib(marker: str) -> str:
    """A library whose constructor, wherever it runs, creates ``marker`` if it can."""
    source = (
        "#include <fcntl.h>\n#include <unistd.h>\n"
        f'__attribute__((constructor)) static void pwn(void) {{ int fd = open("{marker}", O_CREAT|O_WRONLY, 0600);'
        " if (fd >= 0) close(fd); }"
    )
    return _compiled("pwn.so", source, "-shared", "-fPIC")


def test_row1_a_directory_of_its_home_on_tasuki_path_runs_nothing_on_the_host(task: Task) -> None:
    marker = task.canary / "pwned"
    fake = f"#!/bin/sh\\ntouch {marker}\\nexec /usr/bin/$(basename $0) \"$@\"\\n"
    first, second, third = task.agent(
        f"mkdir -p $HOME/bin && for p in bwrap prlimit sh setpriv env; do printf '{fake}' > $HOME/bin/$p;"
        f' chmod +x $HOME/bin/$p; done; echo "{HOST_HOME}/bin" >> $TASUKI_PATH; echo planted',
        "echo second call",
        "echo third call",
    )
    assert "planted" in first
    assert "second call" in second
    assert "third call" in third
    assert not marker.exists(), "a program of the agent's ran on the host"
    assert "outside the sandbox's own paths: refused" in second
    assert task.untouched()


def test_row2_ld_preload_in_tasuki_env_loads_nothing_on_the_host(task: Task) -> None:
    marker = task.canary / "pwned"
    first, second, _ = task.agent(
        f'{_lib(str(marker))} && echo "LD_PRELOAD={HOST_HOME}/pwn.so" >> $TASUKI_ENV'
        f' && echo "LD_LIBRARY_PATH={HOST_HOME}" >> $TASUKI_ENV',
        "echo [$LD_PRELOAD]",
        "true",
    )
    assert "compiled" in first
    assert not marker.exists(), "the agent's library ran on the host"
    assert "LD_PRELOAD is a variable of the dynamic loader: refused" in second
    assert "LD_LIBRARY_PATH is a variable of the dynamic loader: refused" in second
    assert "[]" in second
    assert task.untouched()


def test_row3_proc_sys_is_read_only(task: Task) -> None:
    (out,) = task.agent(
        "awk '$5 == \"/proc/sys\" {print $6}' /proc/self/mountinfo;"
        " python3 -c 'import os; os.open(\"/proc/sys/kernel/core_pattern\", os.O_WRONLY)' 2>&1 | tail -1"
    )
    assert out.splitlines()[0].split(",")[0] == "ro", out
    assert "Errno" in out.splitlines()[1], out  # the write is refused (nothing is written on a success either)


def test_row4_a_forged_layers_description_binds_nothing(task: Task) -> None:
    forged = {"format": 1, "layers": [{"lower": str(task.canary), "path": "loot"}]}
    _first, second = task.agent(
        f"mkdir -p $HOME/.tasuki/layers/0 loot && echo '{json.dumps(forged)}' > $HOME/.tasuki/layers/layers.json",
        "cat loot/secret.txt; ls -A loot /run/tasuki-layers 2>&1",
    )
    assert SECRET not in second
    assert not layers.layers_of(task.home)


def test_row5_the_layer_helper_never_runs_the_agents_code_with_a_capability(task: Task) -> None:
    lower = task.canary.parent / "snapshot"
    (lower / ".venv").mkdir(parents=True)
    (lower / ".venv" / "kept").write_text("snapshot\n")
    task.restore(lower)
    check = r"""#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
__attribute__((constructor)) static void pwn(void) {
    mount("none", "/run/tasuki-layers/lower/0", 0, MS_REMOUNT | MS_BIND, 0);
    int fd = open("/run/tasuki-layers/lower/0/planted", O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) close(fd);
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    while (status && fgets(line, sizeof line, status))
        if (!strncmp(line, "CapEff:", 7) && strcmp(line + 7, "\t0000000000000000\n")) {
            int mark = open("/tmp/home/caps-held", O_CREAT | O_WRONLY, 0600);
            if (mark >= 0) close(mark);
        }
}"""
    first, second, third = task.agent(
        _compiled("pwn.so", check, "-shared", "-fPIC") + '; echo "LD_PRELOAD=/tmp/home/pwn.so" >> $TASUKI_ENV',
        "cat .venv/kept",
        "ls $HOME; echo PYTHONSTARTUP=/tmp/home/x.py >> $TASUKI_ENV; LD_PRELOAD=/tmp/home/pwn.so true; ls $HOME",
    )
    assert "compiled" in first, first
    assert "snapshot" in second
    assert "caps-held" not in third, third
    assert sorted(p.name for p in (lower / ".venv").iterdir()) == ["kept"]


def test_row6_removing_the_home_follows_no_link(task: Task) -> None:
    out, left = task.agent(
        f"mkdir -p $HOME/.tasuki/layers/0 $HOME/deep/er && ln -s {task.canary} $HOME/.tasuki/layers/0/work"
        f" && ln -s {task.canary} $HOME/.tasuki/layers/evil && ln -s {task.canary} $HOME/deep/er/evil"
        f" && ln -s {task.canary}/secret.txt $HOME/deep/file && chmod 000 $HOME/deep/er && echo planted",
        remove_home=True,
    )
    assert "planted" in out
    assert left == []
    assert not task.home.exists()
    assert task.untouched()


def test_row7_env_files_that_are_links_read_and_create_nothing_on_the_host(task: Task) -> None:
    first, second, third, fourth = task.agent(
        f"rm $TASUKI_ENV && ln -s {task.canary}/secret.env $TASUKI_ENV && echo linked",
        "echo [$DATABASE_URL]",
        f"rm -r $HOME/.tasuki && ln -s {task.canary} $HOME/.tasuki && echo linked-dir",
        "echo [$DATABASE_URL]; ls -la $HOME/.tasuki/ | head -5",
    )
    assert "linked" in first
    assert "linked-dir" in third
    assert SECRET not in second + fourth
    assert "[]" in second
    assert "[]" in fourth
    assert task.untouched()


def test_row8_the_layers_own_directories_are_out_of_reach(task: Task) -> None:
    lower = task.canary.parent / "snapshot"
    (lower / ".venv").mkdir(parents=True)
    (lower / ".venv" / "kept").write_text("snapshot\n")
    task.restore(lower)
    described = (layers.layers_dir(task.home) / layers.LAYERS_FILE).read_text()
    first, second = task.agent(
        "echo changed > .venv/kept; ls -A /run/tasuki-layers; mv /run/tasuki-layers /run/x 2>&1 | tail -1;"
        " umount /run/tasuki-layers 2>&1 | tail -1;"
        " find / -xdev -name upper -o -name layers.json 2>/dev/null; echo done",
        f"ls -A {layers.layers_dir(task.home)} 2>&1; mv $HOME/.tasuki $HOME/moved && echo moved; cat .venv/kept",
    )
    assert first.splitlines()[-2] == "done", first
    assert "upper" not in first
    assert "layers.json" not in first
    assert "No such file or directory" in second
    assert "changed" in second
    assert (layers.layers_dir(task.home) / layers.LAYERS_FILE).read_text() == described
    assert (lower / ".venv" / "kept").read_text() == "snapshot\n"


@pytest.fixture(scope="module")
def fleet_service() -> Iterator[int]:
    """A service on the host's 127.0.0.1, where a worker's Redis, PostgreSQL and intake listen."""
    with serve_text(SECRET) as port:
        yield port


def test_row9_the_hosts_loopback_is_out_of_reach_directly_and_through_the_proxy(task: Task, fleet_service: int) -> None:
    via_proxy = "env -u NO_PROXY -u no_proxy curl -sS --max-time 20 -x http://127.0.0.1:3128"
    commands = (
        f"curl -sS --max-time 10 http://127.0.0.1:{fleet_service}/ 2>&1 | tail -1",
        f"{via_proxy} http://127.0.0.1:{fleet_service}/ 2>&1 | tail -1",
        f"{via_proxy} http://localhost:{fleet_service}/ 2>&1 | tail -1",
    )
    refused = hostile_agent.run(task.checkout, task.home, commands, user=task.user, proxy=True)
    assert SECRET not in "".join(refused), refused
    # The same request, with the service named in sandbox.allowed_internal: the attack above would have got it.
    (admitted,) = hostile_agent.run(
        task.checkout, task.home, commands[1:2], user=task.user, proxy=True,
        allowed_internal=[f"127.0.0.1/32:{fleet_service}"],
    )
    assert SECRET in admitted, admitted


FORKS = """python3 -c '
import os, time
started = 0
for _ in range(80):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    started += 1
print("started", started)'"""


def test_row12_forks_past_the_process_limit_fail_and_the_worker_goes_on(task: Task) -> None:
    forks, after = hostile_agent.run(
        task.checkout, task.home,
        (FORKS, "echo still here"),
        user=task.user, processes=40,
    )
    started = int(forks.split("started ")[1].split()[0])
    assert started < 80, forks
    assert "still here" in after


def test_row10_the_kernels_keyrings_are_refused(task: Task) -> None:
    script = (
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, args in (('keyctl', (250, 0, -3, 0)), ('add_key', (248, b'user', b'tasuki', b'x', 1, -3)),"
        " ('request_key', (249, b'user', b'tasuki', None, -3))):\n"
        "    result = libc.syscall(*args)\n"
        "    print(name, result, os.strerror(ctypes.get_errno()) if result < 0 else 'allowed')\n"
    )
    (out,) = task.agent(f"python3 -c \"{script}\"")
    assert out.count("Operation not permitted") == 3, out


def test_row10_a_32_bit_call_does_not_go_around_the_filter(task: Task) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("int 0x80 is x86-64's")
    source = """#include <stdio.h>
int main(void) {
    long r, x;
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(288), "b"(0), "c"(-3) : "memory");
    __asm__ volatile("syscall" : "=a"(x) : "a"(0x40000000 + 250), "D"(0), "S"(-3) : "rcx", "r11", "memory");
    printf("%ld %ld\\n", r, x);
    return 0;
}"""
    (out,) = task.agent(_compiled("k", source) + " && $HOME/k")
    assert out.splitlines()[1] == "-1 -1", out  # -EPERM from both conventions


def test_row11_a_named_pipe_as_an_env_file_never_hangs_the_worker(task: Task) -> None:
    first, second, _, fourth = task.agent(
        "rm $TASUKI_ENV $TASUKI_PATH && mkfifo $TASUKI_ENV $TASUKI_PATH && echo piped",
        "echo still here",
        "echo FOO=bar >> $TASUKI_ENV",
        "echo [$FOO]",
    )
    assert "piped" in first
    assert "still here" in second
    assert "[bar]" in fourth  # the pipe was replaced by a file again


def test_row13_a_mode_000_directory_does_not_keep_the_home(task: Task) -> None:
    _, left = task.agent(
        "mkdir -p $HOME/a/b/c && touch $HOME/a/b/c/f $HOME/a/b/g && chmod 000 $HOME/a/b/c $HOME/a/b $HOME/a",
        remove_home=True,
    )
    assert left == []
    assert not task.home.exists()


def test_seam_env_files_and_their_directory_at_mode_000_keep_no_later_call_from_running(task: Task) -> None:
    # An unprivileged worker's sandbox runs as the worker's own user: the agent's chmod took the worker's rights too,
    # and every later call (the eval's grading among them) failed to write the env files (PermissionError).
    first, second = task.agent("echo A=1 >> $TASUKI_ENV; chmod 000 $TASUKI_ENV $HOME/.tasuki $HOME; echo locked",
                               "echo ran")
    assert first.startswith("locked")
    assert "ran" in second
    assert task.untouched()


def test_row14_host_paths_lead_nowhere_inside(task: Task) -> None:
    (out,) = task.agent(
        f'h="{HOST_HOME}"; echo "[$h]"; ls "$h" 2>&1 | tail -1; ls {task.canary} 2>&1 | tail -1;'
        f" ls {layers.layers_dir(task.home)} 2>&1 | tail -1"
    )
    assert f"[{task.home}]" in out  # known (mountinfo), and harmless: nothing on the host reads it as a path
    assert out.count("No such file or directory") == 3, out


def test_held_the_command_holds_no_capability_and_nested_namespaces_see_locked_mounts(task: Task) -> None:
    (out,) = task.agent(
        "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status | tr -s '\\t ' ' ';"
        " unshare -Urm sh -c 'mount -o remount,bind,rw /usr 2>&1 | tail -1; touch /usr/planted 2>&1 | tail -1';"
        " ls /proc | grep -c '^[0-9]'"
    )
    lines = out.splitlines()
    assert lines[:5] == ["CapPrm: 0000000000000000", "CapEff: 0000000000000000", "CapBnd: 0000000000000000",
                         "CapAmb: 0000000000000000", "NoNewPrivs: 1"], out
    assert not Path("/usr/planted").exists()
    assert int(lines[-2]) <= 6, out  # the sandbox's own processes only (bash, ls, grep and their parents)


def test_held_env_file_lines_cannot_reach_outside_through_dot_dot_or_relative_paths(task: Task) -> None:
    _, second = task.agent(
        "printf '/workspace/../etc\\nbin\\n/tmp/home/../../usr/bin\\n' >> $TASUKI_PATH",
        "echo $PATH",
    )
    assert "'/workspace/../etc' is outside the sandbox's own paths: refused" in second
    assert "'bin' is not an absolute directory" in second


def test_held_the_worker_s_secret_is_nowhere_in_the_sandbox(task: Task) -> None:
    (out,) = task.agent(
        "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; done 2>/dev/null"
    )
    assert hostile_agent.WORKER_SECRET not in out


# The seams issue 36 added, tried directly (fast: no sandbox started).


def test_seam_a_pipe_in_an_env_files_place_is_read_without_blocking(tmp_path: Path) -> None:
    (tmp_path / ".tasuki").mkdir()
    os.mkfifo(tmp_path / ".tasuki" / "env")  # nobody writes to it: a blocking open would never return
    files = envfiles.read(tmp_path)
    assert files.variables == {}
    assert files.skipped == (".tasuki/env is not a regular file: not read",)


def test_seam_env_files_behind_a_link_are_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "env").write_text(f"STOLEN={SECRET}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".tasuki").symlink_to(outside)
    assert envfiles.read(home).variables == {}
    envfiles.prepare(home)  # the link is replaced by a directory of the home's own, never followed
    assert (home / ".tasuki").is_dir()
    assert not (home / ".tasuki").is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["env"]


def test_seam_a_task_without_layers_never_gets_the_helper_and_bwrap_starts_clean(tmp_path: Path) -> None:
    sandbox = Bubblewrap(SandboxSettings())
    home = tmp_path / "home"
    home.mkdir()
    (home / ".tasuki" / "layers").mkdir(parents=True)  # what a forger would write: not where layers are read
    (home / ".tasuki" / "layers" / "layers.json").write_text('{"format": 1, "layers": [{"lower": "/", "path": "x"}]}')
    argv, _ = sandbox.command(["true"], tmp_path, home, {"PATH": "/usr/bin", "LD_PRELOAD": "/x.so"})
    assert layers.HELPER not in argv
    assert argv[0].startswith("/")
    assert any(arg.startswith("/") and arg.endswith("/bwrap") for arg in argv)
    assert argv.index("--clearenv") < argv.index("--setenv")


def test_seam_the_helper_starts_with_an_empty_environment(tmp_path: Path) -> None:
    lower, home, checkout = tmp_path / "lower", tmp_path / "home", tmp_path / "checkout"
    (lower / ".venv").mkdir(parents=True)
    home.mkdir()
    checkout.mkdir()
    layers.lay(home, checkout, lower, [".venv"])
    argv, _ = Bubblewrap(SandboxSettings()).command(["true"], checkout, home, {"LD_PRELOAD": "/x.so"})
    helper = argv.index(layers.HELPER)
    assert "--clearenv" in argv[:helper]
    assert "--setenv" not in argv[:helper]
    applied = argv.index("-i", helper)  # env -i, run by setpriv once every capability is gone
    assert argv[applied - 1].endswith("/env")
    assert argv[applied + 2] == "LD_PRELOAD=/x.so"


def test_seam_removing_a_tree_makes_mode_000_directories_writable_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (outside / "kept").write_text("x")
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    (tree / "a" / "link").symlink_to(outside)
    (tree / "a" / "b").chmod(0)
    (tree / "a").chmod(0)
    assert layers.remove_tree(tree) == ()
    assert not tree.exists()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755
    assert (outside / "kept").exists()


def test_seam_the_environment_marker_is_written_beneath_the_home_never_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("the worker's file\n")
    home = tmp_path / "home"
    (home / ".tasuki").mkdir(parents=True)
    (home / ".tasuki" / "environment").symlink_to(outside)  # what the agent leaves before a resume
    homefiles.write(home, ".tasuki/environment", b"key\n")
    assert outside.read_text() == "the worker's file\n"
    assert homefiles.read(home, ".tasuki/environment", 64) == b"key\n"
    os.unlink(home / ".tasuki" / "environment")
    os.mkfifo(home / ".tasuki" / "environment")
    with pytest.raises(homefiles.Unreadable, match="not a regular file"):
        homefiles.read(home, ".tasuki/environment", 64)
