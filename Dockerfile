# Tasuki's one image: worker (default), beat, webhook intake and Flower (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# git: the agent clones, commits and pushes; ca-certificates: HTTPS to forges and model APIs;
# bubblewrap: the sandbox every agent command runs in (see docker-compose.yml for what it needs);
# socat: the bridge from the sandbox's loopback to its egress proxy (sandbox.network: allowlist).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates bubblewrap socat \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 tasuki \
    && useradd --uid 10001 --gid tasuki --create-home --shell /usr/sbin/nologin tasuki

WORKDIR /app
# Dependencies first, from pyproject.toml and empty packages, so that a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN for package in contexts memory fleet sandbox worker scheduler webhooks console cli replay; do mkdir "$package" && touch "$package/__init__.py"; done \
    && pip install ".[flower]" \
    && rm -rf contexts memory fleet sandbox worker scheduler webhooks console cli replay build ./*.egg-info
COPY contexts ./contexts
COPY memory ./memory
COPY fleet ./fleet
COPY sandbox ./sandbox
COPY worker ./worker
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
