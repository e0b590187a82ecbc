"""A Docker engine for the compose test, on a machine that reaches Debian's packages and PyPI but no image registry.

    engine = docker_engine()                  # dockerd answers (started here, as root, when it does not)
    build_images(engine)                      # stand-ins for python:3.11-slim and redis:7, then PROJECT_IMAGE

The stand-ins are made from Debian's packages: ``debootstrap`` makes a bookworm root file system with this
machine's CA bundle in it (the machine's own package clients trust it, so the image's pip and apt do too),
``docker import`` turns it into a base image, and two small Dockerfiles add Python 3.11 (a virtual
environment at /usr/local, as the official image has its Python there) and Debian's Redis 7. The project's
own Dockerfile is then built unchanged, with host networking (no bridge network exists here) and every
toolchain it offers (``TOOLCHAINS``; the apt layer comes before the code's, so a code change reuses it).

Run as a module to build everything ahead of the tests (``.ci/run`` does, while the rest of the suite runs):

    python -m tests.helpers.docker_host
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

REPO_ROOT = Path(__file__).resolve().parents[2]
# docker-compose.yml's image for every service built from this repository (its TASUKI_IMAGE): a tag of this
# checkout's own, so that two checkouts tested at once on one machine (two CI runs, a developer's run beside one)
# never run each other's code under one shared tag.
PROJECT_IMAGE = f"tasuki:checkout-{hashlib.sha256(str(REPO_ROOT).encode()).hexdigest()[:12]}"
# Every toolchain the Dockerfile's TOOLCHAINS argument offers: the compose tests run a tiny project in each.
TOOLCHAINS = "python node go java rust build"
BASE_IMAGE = "tasuki-standin/debian:bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
STANDIN_LABEL = "org.tasuki.standin"
BUILD_LOCK = Path(tempfile.gettempdir()) / "tasuki-docker-images.lock"
DOCKERD_LOG = Path(tempfile.gettempdir()) / "tasuki-dockerd.log"
START_TIMEOUT_S = 60.0
COMPOSE_SUITE = "trixie"  # the first Debian release with Compose v2
COMPOSE_CACHE = Path(tempfile.gettempdir()) / "tasuki-compose-v2"

# Stand-ins for the registry images the project's Dockerfile and compose file name.
STANDINS = {
    "python:3.11-slim": f"""\
FROM {BASE_IMAGE}
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \\
    && python3 -m venv /usr/local \\
    && rm -rf /var/lib/apt/lists/*
ENV LANG=C.UTF-8
LABEL {STANDIN_LABEL}="python:3.11-slim from Debian {SUITE}'s python3 (tests/helpers/docker_host.py)"
CMD ["python3"]
""",
    "redis:7": f"""\
FROM {BASE_IMAGE}
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \\
    && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /data
WORKDIR /data
LABEL {STANDIN_LABEL}="redis:7 from Debian {SUITE}'s redis-server (tests/helpers/docker_host.py)"
CMD ["redis-server"]
""",
}


class DockerUnavailable(Exception):
    """No Docker engine can be had here; the message says why in one line."""


@dataclass(frozen=True)
class Engine:
    """A Docker engine that answers, and the Compose v2 program to drive it with."""

    compose: tuple[str, ...]

    def docker(self, *args: str, timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["docker", *args], timeout_s=timeout_s, check=check)


def run(argv: list[str], *, timeout_s: float = 600, check: bool = True, stdin: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; on failure raise with its last lines (not a bare exit code)."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=cwd)
    if check and done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise RuntimeError(f"{' '.join(argv[:4])} … exited {done.returncode}:\n{tail}")
    return done


def _answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0


def _start_dockerd() -> None:
    """Start Debian's dockerd as root, with no bridge network (host networking only on these machines)."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerUnavailable("dockerd is not installed (Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        raise DockerUnavailable("no Docker engine answers and only root can start dockerd here")
    log = DOCKERD_LOG.open("ab")
    subprocess.Popen(
        [dockerd, "--bridge=none", "--iptables=false", "--ip6tables=false"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _answers():
            return
        time.sleep(0.5)
    raise DockerUnavailable(f"dockerd did not answer within {START_TIMEOUT_S:.0f} s (log: {DOCKERD_LOG})")


def _compose_v2(argv: list[str]) -> bool:
    done = subprocess.run([*argv, "version", "--short"], capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.strip().lstrip("v").split(".")[0] not in ("", "1")


def _debian_compose_v2() -> Path:
    """Compose v2 from Debian's trixie package, unpacked into a cache directory (nothing installed).

    Bookworm's docker-compose is 1.29, which cannot set what docker-compose.yml asks for the sandbox
    (``systempaths=unconfined`` is Compose v2's and the docker CLI's word for unmasked /proc paths).
    """
    binary = COMPOSE_CACHE / "root" / "usr" / "libexec" / "docker" / "cli-plugins" / "docker-compose"
    if binary.exists():
        return binary
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise DockerUnavailable("no Compose v2 here, and no apt-get to fetch Debian's")
    lists = COMPOSE_CACHE / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    sources = COMPOSE_CACHE / "sources.list"
    sources.write_text(f"deb {MIRROR} {COMPOSE_SUITE} main\n")
    apt = ["-q", "-o", f"Dir::Etc::sourcelist={sources}", "-o", "Dir::Etc::sourceparts=-",
           "-o", f"Dir::State::Lists={lists}", "-o", "APT::Sandbox::User=root"]
    run(["apt-get", *apt, "update"], timeout_s=600)
    run(["apt-get", *apt, "download", "docker-compose"], cwd=COMPOSE_CACHE, timeout_s=600)
    deb = next(COMPOSE_CACHE.glob("docker-compose_*.deb"))
    run(["dpkg", "-x", str(deb), str(COMPOSE_CACHE / "root")])
    if not (binary.exists() and _compose_v2([str(binary)])):
        raise DockerUnavailable(f"{deb.name} did not give a Compose v2 program")
    return binary


def _compose_program() -> tuple[str, ...]:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) and _compose_v2(argv):
            return tuple(argv)
    return (str(_debian_compose_v2()),)


def docker_engine() -> Engine:
    """A Docker engine that answers: the running one, or dockerd started here."""
    if not _answers():
        _start_dockerd()
    return Engine(_compose_program())


def _has_image(engine: Engine, name: str) -> bool:
    return engine.docker("image", "inspect", name, check=False).returncode == 0


def _base_image(engine: Engine) -> None:
    """debootstrap a minimal bookworm with this machine's CA bundle, imported as :data:`BASE_IMAGE`."""
    if shutil.which("debootstrap") is None:
        raise DockerUnavailable("debootstrap is not installed (Debian: apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="tasuki-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), MIRROR], timeout_s=900)
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        certs = rootfs / "usr" / "local" / "share" / "ca-certificates"
        certs.mkdir(parents=True, exist_ok=True)
        if HOST_CA_BUNDLE.exists():
            # update-ca-certificates (the project image installs ca-certificates) keeps what is here.
            shutil.copyfile(HOST_CA_BUNDLE, certs / "host-ca-bundle.crt")
            (rootfs / "etc" / "ssl" / "certs").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HOST_CA_BUNDLE, rootfs / "etc" / "ssl" / "certs" / "ca-certificates.crt")
            (rootfs / "etc" / "pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True,
                                  text=True, timeout=600, check=False)
        tar.stdout.close()
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise RuntimeError(f"docker import of the stand-in root file system failed: {imported.stderr.strip()}")


def _build(engine: Engine, tag: str, dockerfile: str) -> None:
    with tempfile.TemporaryDirectory(prefix="tasuki-standin-") as context:
        (Path(context) / "Dockerfile").write_text(dockerfile)
        engine.docker("build", "--network", "host", "-t", tag, context, timeout_s=900)


def build_images(engine: Engine, *, project: bool = True) -> None:
    """Stand-ins for the registry images (once per machine), then the project's image from this checkout."""
    with FileLock(str(BUILD_LOCK), timeout=1800):  # .ci/run's early build and the test fixture share the work
        missing = [tag for tag in STANDINS if not _has_image(engine, tag)]
        if missing and not _has_image(engine, BASE_IMAGE):
            _base_image(engine)
        for tag in missing:
            _build(engine, tag, STANDINS[tag])
        if project:
            engine.docker("build", "--network", "host", "--build-arg", f"TOOLCHAINS={TOOLCHAINS}", "-t", PROJECT_IMAGE,
                          str(REPO_ROOT), timeout_s=1800)


def main() -> int:
    try:
        engine = docker_engine()
        build_images(engine)
    except (DockerUnavailable, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"docker images: {exc}", file=sys.stderr)
        return 1
    print(f"docker images: {', '.join([*STANDINS, PROJECT_IMAGE])} ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
