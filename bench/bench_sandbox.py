"""The bash tool's cost per call in the bubblewrap sandbox against the same call unsandboxed, in one run; and the same
call in a sandbox with a restored environment's layer (the helper that mounts it, then drops every capability,
docs/environments.md "Layers") against plain bubblewrap; and the same call as a task with ``sandbox.network: full``
runs it (the task's network namespace joined, where socat bridges to the task's egress proxy: sandbox.bridge)
against plain bubblewrap (an empty network namespace of its own, no bridge).

All go through the real tool (scrubbed environment, own session, output capture, prlimit limits); the
command is ``true`` so the ratio is the sandbox's own overhead: namespaces, mounts, bwrap's init.
"""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from agent.tools import Workspace, run_tool
from bench.common import Result, standalone, timed
from sandbox import layers
from sandbox.egress import egress_policy, egress_proxy
from sandbox.host import HOST_ENV, program
from sandbox.jail import SYSTEM_DIRS, WORKSPACE, Bubblewrap, NoSandbox, Sandbox, _ro_bind, probe
from sandbox.settings import SandboxSettings


def _call(workspace: Workspace, sandbox: Sandbox, home: Path | None = None) -> None:
    result = run_tool(workspace, "bash", {"command": "true"}, bash_timeout_s=30, max_output_chars=1000,
                      sandbox=sandbox, limits=SandboxSettings().limits, home=home)
    assert result.status == "success", result.output


def _bare_bwrap(checkout: Path) -> list[str]:
    """bubblewrap by itself running ``true``: the namespaces and the system directories, nothing of Tasuki's (no tool,
    no cgroup, no user, no seccomp, no bridge) — the floor every sandboxed call stands on."""
    binds = [arg for directory in SYSTEM_DIRS for arg in _ro_bind(directory)]
    return [program("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--dev", "/dev", "--proc", "/proc",
            *binds, "--bind", str(checkout), WORKSPACE, "--chdir", WORKSPACE, "--", "true"]


def run(root: Path, *, quick: bool = False) -> list[Result]:
    """Median seconds per call, sandboxed and not, interleaved so that machine noise hits both alike."""
    bubblewrap = Bubblewrap(SandboxSettings())
    problem = probe(bubblewrap)
    if problem is not None:
        print(f"sandbox: skipped, {problem}", flush=True)
        return []
    checkout = root / "checkout"
    checkout.mkdir(parents=True)
    workspace = Workspace(checkout)
    rounds = 10 if quick else 200
    home, layered_home, layered_checkout = root / "home", root / "layered-home", root / "layered-checkout"
    for directory in (home, layered_home, layered_checkout, root / "snapshot" / ".venv"):
        directory.mkdir(parents=True)
    layers.lay(layered_home, layered_checkout, root / "snapshot", [".venv"])
    layered = Workspace(layered_checkout)
    times: dict[str, list[float]] = {"bare": [], "none": [], "bubblewrap": [], "layers": [], "full": []}
    paired: list[float] = []  # plain bubblewrap, in the loop beside the bridge's calls
    bare_line = _bare_bwrap(checkout)
    with egress_proxy(egress_policy("full", (), ()), lambda _: None) as socket:
        full = bubblewrap.with_egress(socket)
        calls: dict[str, Callable[[], object]] = {
            "bare": lambda: subprocess.run(bare_line, check=True, env=HOST_ENV),
            "none": lambda: _call(workspace, NoSandbox(), home),
            "bubblewrap": lambda: _call(workspace, bubblewrap, home),
            "layers": lambda: _call(layered, bubblewrap, layered_home),
            "full": lambda: _call(workspace, full, home),
        }
        # One call of each kind in turn, as the rows of 8da9827 were measured. The bridge's row is set against plain
        # bubblewrap in a loop of their own: the call right after a layered one pays some 10 ms of the kernel's
        # teardown of that one's mounts (swapping two kinds' order moved it from one to the other), which would hide
        # a cost of a millisecond or two.
        for group in (("bare", "none", "bubblewrap", "layers"), ("bubblewrap", "full")):
            into = {name: times[name] for name in group}
            if "full" in group:
                into["bubblewrap"] = paired
            for _ in range(rounds):
                for name in group:
                    into[name].append(timed(calls[name]))
    plain = statistics.median(times["bare"])
    bare, boxed, laid, bridged = (statistics.median(times[name]) for name in ("none", "bubblewrap", "layers", "full"))
    bridged = bridged / statistics.median(paired) * boxed  # full against the plain calls of its own loop
    print(f"sandbox: bare bwrap running true {plain * 1e3:.1f} ms; the tool's call in bubblewrap {boxed / plain:.2f} "
          f"of it, with a layer {laid / plain:.2f}, with network full's bridge {bridged / plain:.2f}", flush=True)
    ratio = boxed / bare
    print(f"sandbox: bash tool call unsandboxed {bare * 1e3:.1f} ms, in bubblewrap {boxed * 1e3:.1f} ms, "
          f"ratio {ratio:.2f}; with a layer {laid * 1e3:.1f} ms, {laid / boxed:.2f} of plain bubblewrap; with network "
          f"full's proxy bridge {bridged * 1e3:.1f} ms, {bridged / boxed:.2f} of plain bubblewrap, "
          f"{bridged / bare:.2f} of unsandboxed (median of {rounds}, interleaved)", flush=True)
    return [
        Result("bash call in bubblewrap / bare bwrap", f"{boxed / plain:.2f}", "", None),
        Result("bash call with a layer / bare bwrap", f"{laid / plain:.2f}", "", None),
        Result("bash call with network full's bridge / bare bwrap", f"{bridged / plain:.2f}", "", None),
        Result("bash call: bubblewrap / none", f"{ratio:.2f}", "", None),
        Result("bash call: bubblewrap with a layer / plain", f"{laid / boxed:.2f}", "", None),
        Result("bash call: network full (proxy bridge) / plain bubblewrap", f"{bridged / boxed:.2f}", "", None),
        Result("bash call: network full (proxy bridge) / none", f"{bridged / bare:.2f}", "", None),
    ]


if __name__ == "__main__":
    standalone(run, __doc__)
