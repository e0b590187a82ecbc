"""The suite cleans up after the compose tests: the images they built and the dockerd they started go, unless
TASUKI_KEEP_DOCKER asks to keep them; what was there before stays (tests/helpers/docker_host.py)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import docker_host
from tests.helpers.context_support import wait_for


@pytest.fixture
def owned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "owned.json"
    monkeypatch.setattr(docker_host, "OWNED", path)
    return path


@pytest.fixture
def stand_in_dockerd() -> Iterator[subprocess.Popen[bytes]]:
    """A process in the place of the dockerd the tests started (only its pid is recorded and signalled)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def _docker_answers() -> bool:
    return docker_host._answers()


def _import_empty_image(tag: str) -> None:
    tar = subprocess.Popen(["tar", "-c", "-T", "/dev/null"], stdout=subprocess.PIPE)
    subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, check=True, capture_output=True, timeout=120)
    tar.wait()


def _has_image(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False).returncode == 0


def test_nothing_recorded_means_nothing_done(owned: Path) -> None:
    assert docker_host.clean_up({}) == []
    assert not owned.exists()


def test_keep_docker_keeps_the_dockerd_and_the_record(owned: Path, stand_in_dockerd: subprocess.Popen[bytes]) -> None:
    docker_host._record(dockerd=stand_in_dockerd.pid)
    docker_host._record(image="tasuki-standin/never-built:x")

    said = docker_host.clean_up({"TASUKI_KEEP_DOCKER": "1"})

    assert said == [f"kept (as TASUKI_KEEP_DOCKER asks): tasuki-standin/never-built:x, dockerd pid "
                    f"{stand_in_dockerd.pid}"]
    assert stand_in_dockerd.poll() is None
    assert owned.exists()


@pytest.mark.skipif(not _docker_answers(), reason="no Docker engine answers here")
def test_clean_removes_only_the_images_the_tests_built_and_stops_the_dockerd_they_started(
    owned: Path, stand_in_dockerd: subprocess.Popen[bytes]
) -> None:
    tag = uuid.uuid4().hex[:8]
    ours, theirs = f"tasuki-cleanup-test/ours:{tag}", f"tasuki-cleanup-test/theirs:{tag}"
    _import_empty_image(theirs)  # there before: not the tests' to remove
    try:
        _import_empty_image(ours)
        docker_host._record(image=ours)
        docker_host._record(dockerd=stand_in_dockerd.pid)
        containers = subprocess.run(["docker", "ps", "-q"], capture_output=True, text=True, check=True).stdout.split()

        said = docker_host.clean_up({})

        assert f"removed the image {ours}" in said
        assert not _has_image(ours)
        assert _has_image(theirs)
        assert not owned.exists()
        if containers:  # a dockerd that still runs containers (another run's) is left running, and says so
            assert stand_in_dockerd.poll() is None
            assert any("left the dockerd" in line for line in said)
        else:
            wait_for(lambda: stand_in_dockerd.poll() is not None or None, timeout=30, what="the dockerd to stop")
            assert f"stopped the dockerd the tests started (pid {stand_in_dockerd.pid})" in said
    finally:
        subprocess.run(["docker", "image", "rm", "-f", ours, theirs], capture_output=True, check=False)


@pytest.mark.skipif(not _docker_answers(), reason="no Docker engine answers here")
def test_keep_docker_images_keeps_the_images_but_stops_the_dockerd(
    owned: Path, stand_in_dockerd: subprocess.Popen[bytes]
) -> None:
    ours = f"tasuki-cleanup-test/kept:{uuid.uuid4().hex[:8]}"
    try:
        _import_empty_image(ours)
        docker_host._record(image=ours)

        said = docker_host.clean_up({"TASUKI_KEEP_DOCKER": "images"})

        assert said == [f"kept the images (as TASUKI_KEEP_DOCKER=images asks): {ours}"]
        assert _has_image(ours)
        assert not owned.exists()
    finally:
        subprocess.run(["docker", "image", "rm", "-f", ours], capture_output=True, check=False)
