# Tasuki's one image: worker (default), beat, webhook intake and Flower (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The toolchains the agent's commands can use, from Debian's packages (docs/environments.md "Toolchains"):
#   docker build --build-arg TOOLCHAINS="python node go java rust build" .
# python: python3 python3-venv python3-pip; node: nodejs npm; go: golang-go; java: default-jdk-headless maven;
# rust: rustc cargo; build: build-essential (gcc, make). The image's own Python (/usr/local) is there whatever
# is chosen; Tasuki runs from a virtualenv of its own (/app/venv) that the agent never sees.
# On Debian bookworm, whose own Go (1.19) and Rust (1.63) cannot build most maintained projects, Go comes from
# bookworm-backports (1.23; nothing else is taken from there) and Rust from rustc-web/cargo-web (the current Rust
# bookworm's security updates carry); later releases (trixie: Go 1.24, Rust 1.85) use their own.
ARG TOOLCHAINS="python node"

# git: the agent clones, commits and pushes; ca-certificates: HTTPS to forges and model APIs;
# bubblewrap: the sandbox every agent command runs in (see docker-compose.yml for what it needs);
# socat: the bridge from the sandbox's loopback to its egress proxy (sandbox.network: allowlist).
# /usr/share/man/man1: the JDK's packages install their man pages' alternatives there (slim images lack it).
RUN set -eu; packages="git ca-certificates bubblewrap socat"; backports=""; \
    release="$(. /etc/os-release && echo "$VERSION_CODENAME")"; \
    for toolchain in $TOOLCHAINS; do \
      case "$toolchain" in \
        python) packages="$packages python3 python3-venv python3-pip" ;; \
        node) packages="$packages nodejs npm" ;; \
        go) if [ "$release" = bookworm ]; then backports="golang-go"; else packages="$packages golang-go"; fi ;; \
        java) packages="$packages default-jdk-headless maven"; mkdir -p /usr/share/man/man1 ;; \
        rust) if [ "$release" = bookworm ]; then packages="$packages rustc-web cargo-web"; \
              else packages="$packages rustc cargo"; fi ;; \
        build) packages="$packages build-essential" ;; \
        *) echo "TOOLCHAINS: unknown toolchain '$toolchain' (known: python node go java rust build)" >&2; exit 1 ;; \
      esac; \
    done; \
    if [ -n "$backports" ]; then \
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
        /usr/share/keyrings/debian-archive-keyring.gpg > /etc/apt/sources.list.d/backports.sources; \
    fi; \
    apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages \
    && if [ -n "$backports" ]; then \
         DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -t bookworm-backports $backports; \
       fi \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 tasuki \
    && useradd --uid 10001 --gid tasuki --create-home --shell /usr/sbin/nologin tasuki

WORKDIR /app
# Tasuki's own virtualenv: its bin leads PATH for Tasuki's commands, and is left out of the agent's PATH and
# sandbox (sandbox/toolchains.py), whose python3 is the image's own, without Tasuki's dependencies.
RUN python -m venv /app/venv
ENV PATH=/app/venv/bin:$PATH
# Dependencies first, from pyproject.toml and empty packages, so that a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN for package in contexts memory fleet sandbox agent worker evals scheduler webhooks console cli replay; do mkdir "$package" && touch "$package/__init__.py"; done \
    && pip install ".[flower]" \
    && rm -rf contexts memory fleet sandbox agent worker evals scheduler webhooks console cli replay build ./*.egg-info
COPY contexts ./contexts
COPY memory ./memory
COPY fleet ./fleet
COPY sandbox ./sandbox
COPY agent ./agent
COPY worker ./worker
COPY evals ./evals
COPY scheduler ./scheduler
COPY webhooks ./webhooks
COPY console ./console
COPY cli ./cli
COPY replay ./replay
RUN pip install --no-deps --force-reinstall . && rm -rf build ./*.egg-info
COPY config.yaml ./

# Contexts, checkouts, the beat schedule and Flower's state live under /data, where docker-compose.yml
# mounts named volumes (no VOLUME here: it would leave anonymous volumes behind). A fresh named volume
# copies these directories, with their owner and mode, from the image.
RUN mkdir -p /data/contexts /data/workspaces /data/git-cache /data/beat /data/flower \
    && chown -R tasuki:tasuki /data \
    && chmod -R 0700 /data

ENV TASUKI_CONFIG=/app/config.yaml \
    TASUKI__CONTEXTS__BASE_DIR=/data/contexts \
    TASUKI__CONTEXTS__WORKSPACES_DIR=/data/workspaces \
    TASUKI__CONTEXTS__GIT_CACHE_DIR=/data/git-cache

USER tasuki
ENTRYPOINT ["tasuki"]
CMD ["worker"]
