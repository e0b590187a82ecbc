"""A Docker engine for the compose test, on a machine that reaches Debian's packages and PyPI but no image registry.

    engine = docker_engine()                  # dockerd answers (started here, as root, when it does not)
    build_images(engine)                      # stand-ins for the registry images, then PROJECT_IMAGE

The stand-ins are made from Debian's packages: ``debootstrap`` makes a bookworm root file system with this
machine's CA bundle in it (the machine's own package clients trust it, so the image's pip and apt do too),
``docker import`` turns it into a base image, and small Dockerfiles add Python 3.11 (a virtual environment at
/usr/local, as the official image has its Python there), Debian's Redis 7, and for the compose file's ``fleet``
profile PostgreSQL 16 with pgvector from the ``pgserver`` wheel (pip fetches it when the image is built). The project's
own Dockerfile is then built unchanged, with host networking (no bridge network exists here) and every
toolchain it offers (``TOOLCHAINS``; the apt layer comes before the code's, so a code change reuses it).

Run as a module to build everything ahead of the tests (``.ci/run`` does, while the rest of the suite runs):

    python -m tests.helpers.docker_host

What the tests start or build here — dockerd when none answered, each image that was missing — is recorded in
:data:`OWNED`; ``python -m tests.helpers.docker_host clean`` (run by ``./tasuki test`` and ``.ci/run`` at the end)
removes those images and stops that dockerd, and nothing else: images that were there before and a dockerd that
was already running stay, and so does a dockerd that still runs containers. ``TASUKI_KEEP_DOCKER=1`` keeps everything
(the next run then builds nothing); ``TASUKI_KEEP_DOCKER=images`` keeps the images on disk but stops dockerd.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
OWNED = Path(tempfile.gettempdir()) / f"tasuki-docker-owned-{PROJECT_IMAGE.rpartition('-')[2]}.json"
KEEP_ENV = "TASUKI_KEEP_DOCKER"
STOP_TIMEOUT_S = 60.0
PGSERVER_VERSION = "0.1.4"  # pyproject.toml's test extra: the PostgreSQL the fleet tests run on the host

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
    # PostgreSQL 16 with pgvector from the pgserver wheel the fleet tests run on the host (pyproject.toml's test
    # extra; --no-deps: only its binaries are used), and an entrypoint with the official image's interface as far
    # as docker-compose.yml uses it (POSTGRES_ENTRYPOINT below).
    "pgvector/pgvector:pg16": f"""\
FROM {BASE_IMAGE}
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \\
    && rm -rf /var/lib/apt/lists/* \\
    && python3 -m venv /opt/pgserver \\
    && /opt/pgserver/bin/pip install --no-cache-dir --no-deps pgserver=={PGSERVER_VERSION} \\
    && useradd --system --user-group --home-dir /var/lib/postgresql postgres \\
    && mkdir -p /var/lib/postgresql/data \\
    && chown -R postgres:postgres /var/lib/postgresql && chmod 0700 /var/lib/postgresql/data
COPY docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/opt/pgserver/lib/python3.11/site-packages/pgserver/pginstall/bin:$PATH \\
    PGDATA=/var/lib/postgresql/data LANG=C.UTF-8
LABEL {STANDIN_LABEL}="pgvector/pgvector:pg16 from the pgserver {PGSERVER_VERSION} wheel (tests/helpers/docker_host.py)"
ENTRYPOINT ["docker-entrypoint.sh"]
STOPSIGNAL SIGINT
EXPOSE 5432
CMD ["postgres"]
""",
}
# The pgvector image's entrypoint, as much of it as docker-compose.yml uses: started as root, it gives the data
# directory to ``postgres`` and runs itself again as that user; on a first start (no PG_VERSION) it refuses without
# POSTGRES_PASSWORD, as the official image does, runs initdb with POSTGRES_USER as the superuser and that password,
# and creates POSTGRES_DB; later starts keep the data. Connections on the container's socket are trusted (the
# healthcheck's pg_isready, ``docker compose exec postgres psql``); every TCP connection needs the password
# (scram-sha-256; the official image trusts 127.0.0.1 too, which the tests' host networking would make every
# connection). The first start's setup server listens on a private socket only, so the healthcheck never finds it
# ready before the real server is (the official image's can). A command that starts with ``-`` is postgres's
# options, as in the official image; PGPORT moves the port for the server and the clients alike.
POSTGRES_ENTRYPOINT = """\
#!/bin/bash
set -euo pipefail
if [[ "${1:0:1}" == - ]]; then set -- postgres "$@"; fi
if [[ "$1" == postgres && "$(id -u)" == 0 ]]; then
    mkdir -p "$PGDATA"
    chown postgres:postgres "$PGDATA"
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [[ "$1" == postgres && ! -s "$PGDATA/PG_VERSION" ]]; then
    if [[ -z "${POSTGRES_PASSWORD:-}" ]]; then
        echo "Error: Database is uninitialized and superuser password is not specified." >&2
        echo "       You must specify POSTGRES_PASSWORD to a non-empty value for the superuser." >&2
        exit 1
    fi
    user=${POSTGRES_USER:-postgres}
    initdb --pgdata="$PGDATA" --username="$user" --pwfile=<(printf '%s\\n' "$POSTGRES_PASSWORD") \\
        --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    database=${POSTGRES_DB:-$user}
    if [[ "$database" != postgres ]]; then  # on a private socket: pg_isready sees nothing until the real start
        setup=$(mktemp -d)
        pg_ctl --pgdata="$PGDATA" --wait --options="-c listen_addresses='' -c unix_socket_directories=$setup" start
        createdb --host="$setup" --username="$user" "$database"
        pg_ctl --pgdata="$PGDATA" --wait --mode=fast stop
        rmdir "$setup"
    fi
    echo "PostgreSQL init process complete; ready for start up."
fi
exec "$@"
"""
STANDIN_FILES = {"pgvector/pgvector:pg16": {"docker-entrypoint.sh": POSTGRES_ENTRYPOINT}}


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
    started = subprocess.Popen(
        [dockerd, "--bridge=none", "--iptables=false", "--ip6tables=false"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    _record(dockerd=started.pid)
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


def _build(engine: Engine, tag: str, dockerfile: str, files: dict[str, str] | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="tasuki-standin-") as context:
        (Path(context) / "Dockerfile").write_text(dockerfile)
        for name, text in (files or {}).items():
            (Path(context) / name).write_text(text)
            (Path(context) / name).chmod(0o755)
        engine.docker("build", "--network", "host", "-t", tag, context, timeout_s=900)


def build_images(engine: Engine, *, project: bool = True) -> None:
    """Stand-ins for the registry images (once per machine), then the project's image from this checkout."""
    with FileLock(str(BUILD_LOCK), timeout=1800):  # .ci/run's early build and the test fixture share the work
        missing = [tag for tag in STANDINS if not _has_image(engine, tag)]
        if missing and not _has_image(engine, BASE_IMAGE):
            _record(image=BASE_IMAGE)  # before the build: a build cut short leaves nothing unrecorded
            _base_image(engine)
        for tag in missing:
            _record(image=tag)
            _build(engine, tag, STANDINS[tag], STANDIN_FILES.get(tag))
        if project:
            if not _has_image(engine, PROJECT_IMAGE):
                _record(image=PROJECT_IMAGE)
            engine.docker("build", "--network", "host", "--build-arg", f"TOOLCHAINS={TOOLCHAINS}", "-t", PROJECT_IMAGE,
                          str(REPO_ROOT), timeout_s=1800)


def _owned() -> dict[str, Any]:
    try:
        data = json.loads(OWNED.read_text())
    except (OSError, ValueError):
        return {"dockerd": None, "images": []}
    return data if isinstance(data, dict) else {"dockerd": None, "images": []}


def _record(*, dockerd: int | None = None, image: str | None = None) -> None:
    """Add a dockerd this run started or an image it builds to :data:`OWNED` (shared by the build and the tests)."""
    with FileLock(str(OWNED) + ".lock", timeout=60):
        owned = _owned()
        if dockerd is not None:
            owned["dockerd"] = dockerd
        if image is not None and image not in owned["images"]:
            owned["images"].append(image)
        OWNED.write_text(json.dumps(owned))


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent to reap it does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def clean_up(environ: dict[str, str] | None = None) -> list[str]:
    """Remove the images the tests built and stop the dockerd they started (:data:`OWNED`), unless
    ``TASUKI_KEEP_DOCKER=1``; returns what was done, one line each."""
    env = os.environ if environ is None else environ
    owned = _owned()
    pid, images = owned.get("dockerd"), list(owned.get("images") or [])
    if pid is None and not images:
        return []
    keep = env.get(KEEP_ENV, "")
    if keep not in ("", "0", "images"):
        return [f"kept (as {KEEP_ENV} asks): " + ", ".join([*images, *([f"dockerd pid {pid}"] if pid else [])])]
    said: list[str] = []
    if keep == "images":  # built once per machine (CI's way): kept on disk for the next run's dockerd
        said.append(f"kept the images (as {KEEP_ENV}=images asks): {', '.join(images) or 'none'}")
    elif images and _answers():
        for tag in reversed(images):  # the project image and the stand-ins before the base they are built on
            if run(["docker", "image", "rm", "-f", tag], timeout_s=300, check=False).returncode == 0:
                said.append(f"removed the image {tag}")
    running = run(["docker", "ps", "-q"], timeout_s=60, check=False).stdout.split() if _answers() else []
    if isinstance(pid, int) and _alive(pid) and running:  # another run's containers (two checkouts on one machine)
        said.append(f"left the dockerd the tests started (pid {pid}) running: {len(running)} containers still use it")
    elif isinstance(pid, int) and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # dockerd stops its containers first; there is no event to wait on
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        said.append(f"stopped the dockerd the tests started (pid {pid})")
    OWNED.unlink(missing_ok=True)
    return said


def main() -> int:
    if sys.argv[1:] == ["clean"]:
        for line in clean_up():
            print(f"docker: {line}")
        return 0
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
