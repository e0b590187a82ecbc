"""Whether the worker's toolchains are new enough for a checkout (issue 41): the versions a repository asks for, read
from its top-level files, beside the versions of the ``go``, ``node``, ``rustc``, ``javac`` and ``python3`` the agent
gets, and one line for each that falls short.

A repository asks in the files its own tools read: ``go.mod``'s ``go`` line, ``package.json``'s ``engines.node``,
``.nvmrc`` and ``.node-version``, ``Cargo.toml``'s ``rust-version`` (or its ``edition``), ``rust-toolchain(.toml)``,
``pom.xml``'s release, source or ``java.version``, a Gradle build's language version or ``sourceCompatibility``,
``.java-version``, ``pyproject.toml``'s ``requires-python`` and ``.python-version``. The checkout is the repository's
(hostile until proven otherwise): each file is read beneath it without following a link, no more than
:data:`READ_LIMIT` bytes, and only as text to match. The installed versions come from the toolchains' own
``--version`` run outside any checkout (``cwd`` ``/``, ``GOTOOLCHAIN=local``, nothing of the task's in the
environment), so no file of the repository's can choose what answers.

A shortfall is told, never enforced: the environment's line and the agent's first message carry it, and the agent's
commands still run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox import homefiles

READ_LIMIT = 256 * 1024  # of a manifest read to find its version (a pom.xml is seldom more)
VERSION_TIMEOUT_S = 30
FIX = 'the worker\'s image needs a newer one (docs/environments.md, "Toolchains")'

Version = tuple[int, ...]

# The command that says each toolchain's version, and the program the agent would run.
COMMANDS: dict[str, tuple[str, ...]] = {
    "go": ("go", "version"),
    "node": ("node", "--version"),
    "rust": ("rustc", "--version"),
    "java": ("javac", "-version"),
    "python": ("python3", "--version"),
}
_EDITIONS: dict[str, Version] = {"2018": (1, 31), "2021": (1, 56), "2024": (1, 85)}


@dataclass(frozen=True)
class Wanted:
    """A version a repository asks for: the toolchain, the least version it accepts, and where it says so."""

    toolchain: str
    minimum: Version
    source: str  # "go.mod: go 1.21.0"


def version_text(version: Version) -> str:
    return ".".join(str(part) for part in version)


def parse_version(text: str) -> Version | None:
    """The first dotted number in ``text`` ("go1.23.5" → (1, 23, 5), "v20.11.0" → (20, 11, 0)); Java's "1.8" is 8."""
    found = re.search(r"(\d+(?:\.\d+)*)", text)
    if found is None:
        return None
    return tuple(int(part) for part in found.group(1).split(".")[:3])


def _java(version: Version | None) -> Version | None:
    if version is not None and version[0] == 1 and len(version) > 1:
        return version[1:2]  # "1.8" is Java 8
    return version


def _lowest_bound(text: str) -> Version | None:
    """The least version a range admits, read loosely: the smallest lower bound of its ``||`` alternatives
    (">=18", "^20.9.0 || >=22", "18.x"); None when an alternative has none ("*", "<20")."""
    bounds: list[Version] = []
    for alternative in text.split("||"):
        match = re.search(r"(?:^|\s)(?:>=?|\^|~|=|v)?\s*(\d+(?:\.\d+)*)", alternative.strip())
        if match is None or alternative.strip().startswith("<"):
            return None
        version = parse_version(match.group(1))
        if version is not None:
            bounds.append(version)
    return min(bounds) if bounds else None


def _read(checkout: Path, name: str) -> str | None:
    try:
        data = homefiles.read(checkout, name, READ_LIMIT)
    except OSError:
        return None
    return None if data is None else data[:READ_LIMIT].decode("utf-8", "replace")


def _toml(text: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):  # a repository's file: nested past Python's stack is no version
        return {}


def _go(read: Callable[[str], str | None]) -> list[Wanted]:
    text = read("go.mod")
    match = re.search(r"^go\s+(\d+\.\d+(?:\.\d+)?)\s*$", text or "", re.MULTILINE)
    version = parse_version(match.group(1)) if match else None
    return [Wanted("go", version, f"go.mod: go {match.group(1)}")] if match and version else []


def _node(read: Callable[[str], str | None]) -> list[Wanted]:
    text = read("package.json")
    if text:
        try:
            engines = json.loads(text).get("engines") or {}
        except (ValueError, AttributeError, RecursionError):  # not JSON, not an object, or nested past the stack
            engines = {}
        node = engines.get("node") if isinstance(engines, dict) else None
        version = _lowest_bound(node) if isinstance(node, str) else None
        if isinstance(node, str) and version is not None:
            return [Wanted("node", version, f'package.json: engines.node "{node.strip()[:40]}"')]
    for name in (".nvmrc", ".node-version"):
        line = (read(name) or "").strip().splitlines()[:1]
        version = parse_version(line[0]) if line and re.match(r"v?\d", line[0]) else None
        if version is not None:
            return [Wanted("node", version, f"{name}: {line[0][:40]}")]
    return []


def _rust(read: Callable[[str], str | None]) -> list[Wanted]:
    for name in ("rust-toolchain.toml", "rust-toolchain"):
        text = read(name)
        if text is None:
            continue
        channel = (_toml(text).get("toolchain") or {}) if name.endswith(".toml") else {"channel": text.strip()}
        value = channel.get("channel") if isinstance(channel, dict) else None
        if isinstance(value, str) and re.fullmatch(r"\d+\.\d+(\.\d+)?", value.strip()):
            return [Wanted("rust", parse_version(value) or (), f"{name}: {value.strip()}")]
    package = _toml(read("Cargo.toml") or "").get("package")
    if not isinstance(package, dict):
        return []
    rust_version = package.get("rust-version")
    if isinstance(rust_version, str) and (version := parse_version(rust_version)):
        return [Wanted("rust", version, f'Cargo.toml: rust-version "{rust_version}"')]
    edition = package.get("edition")
    if isinstance(edition, str) and edition in _EDITIONS:
        return [Wanted("rust", _EDITIONS[edition], f'Cargo.toml: edition "{edition}"')]
    return []


_POM = re.compile(
    r"<(maven\.compiler\.release|release|maven\.compiler\.source|java\.version|maven\.compiler\.target)>"
    r"\s*(\d+(?:\.\d+)?)\s*</\1>"
)
_GRADLE = re.compile(
    r"(?:JavaLanguageVersion\.of\(\s*(\d+)\s*\)|sourceCompatibility\s*=\s*(?:JavaVersion\.VERSION_)?['\"]?(\d+(?:[._]\d+)?))"
)


def _java_wanted(read: Callable[[str], str | None]) -> list[Wanted]:
    pom = read("pom.xml")
    if pom:
        found = dict(_POM.findall(pom))
        for name in ("maven.compiler.release", "release", "maven.compiler.source", "java.version",
                     "maven.compiler.target"):
            if name in found and (version := _java(parse_version(found[name]))):
                return [Wanted("java", version, f"pom.xml: <{name}>{found[name]}")]
    for name in ("build.gradle.kts", "build.gradle"):
        match = _GRADLE.search(read(name) or "")
        if match:
            value = (match.group(1) or match.group(2)).replace("_", ".")
            version = _java(parse_version(value))
            if version:
                return [Wanted("java", version, f"{name}: Java {value}")]
    line = (read(".java-version") or "").strip()
    version = _java(parse_version(line)) if line else None
    return [Wanted("java", version, f".java-version: {line[:40]}")] if version else []


def _python(read: Callable[[str], str | None]) -> list[Wanted]:
    project = _toml(read("pyproject.toml") or "").get("project")
    requires = project.get("requires-python") if isinstance(project, dict) else None
    if isinstance(requires, str):
        lower = re.search(r">=?\s*(\d+(?:\.\d+)*)", requires) or re.search(r"(?:~=|==)\s*(\d+\.\d+)", requires)
        if lower and (version := parse_version(lower.group(1))):
            return [Wanted("python", version, f'pyproject.toml: requires-python "{requires.strip()[:40]}"')]
    line = (read(".python-version") or "").strip().splitlines()[:1]
    version = parse_version(line[0]) if line and re.match(r"\d", line[0]) else None
    return [Wanted("python", version[:2], f".python-version: {line[0][:40]}")] if version else []


def wanted(checkout: Path) -> list[Wanted]:
    """The versions the checkout's top-level files ask for, one per toolchain at most."""

    def read(name: str) -> str | None:
        return _read(checkout, name)

    return [*_go(read), *_node(read), *_rust(read), *_java_wanted(read), *_python(read)]


def _older(have: Version, minimum: Version) -> bool:
    width = max(len(have), len(minimum))
    return have + (0,) * (width - len(have)) < minimum + (0,) * (width - len(minimum))


def installed(toolchain: str, path: Sequence[str]) -> Version | None:
    """The version of ``toolchain``'s program on ``path`` (the agent's), None when it is not there or says none."""
    return _installed(toolchain, tuple(path))


@functools.lru_cache(maxsize=32)
def _installed(toolchain: str, path: tuple[str, ...]) -> Version | None:
    # The worker's toolchains do not change while it runs: each is asked once per process.
    argv = COMMANDS[toolchain]
    program = shutil.which(argv[0], path=os.pathsep.join(path))
    if program is None:
        return None
    environment = {"PATH": os.pathsep.join(path), "GOTOOLCHAIN": "local", "LC_ALL": "C"}
    for name in ("HOME", "RUSTUP_HOME", "JAVA_HOME"):  # the worker's, never the task's
        if name in os.environ:
            environment[name] = os.environ[name]
    try:
        done = subprocess.run([program, *argv[1:]], cwd="/", env=environment, capture_output=True, text=True,
                              timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    version = parse_version(done.stdout + " " + done.stderr)
    return _java(version) if toolchain == "java" else version


def shortfalls(checkout: Path, path: Sequence[str],
               version_of: Callable[[str, Sequence[str]], Version | None] = installed) -> list[str]:
    """One line per toolchain the checkout asks a newer version of, or that the agent's ``path`` lacks."""
    lines: list[str] = []
    for want in wanted(checkout):
        have = version_of(want.toolchain, path)
        program = COMMANDS[want.toolchain][0]
        if have is None:
            lines.append(f"{want.source} asks for {want.toolchain} ≥ {version_text(want.minimum)}, and the worker has "
                         f"no {program}: {FIX}")
        elif _older(have, want.minimum):
            lines.append(f"{want.source} asks for {want.toolchain} ≥ {version_text(want.minimum)}; the worker's "
                         f"{program} is {version_text(have)}: {FIX}")
    return lines
