# microscheduler gateway. One uvicorn worker: the gateway owns per-GPU state.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    MICROSCHEDULER_CONFIG_DIR=/app/config MICROSCHEDULER_HOST=0.0.0.0 MICROSCHEDULER_PORT=8080 \
    MICROSCHEDULER_STATE_DIR=/app/var
WORKDIR /app

# Dependencies from the lock only: each file's sha256 must match (a file that is not one
# locked, e.g. one uploaded later for the same version, fails the build), wheels only
# (nothing is built from source with unpinned build tools). The lock holds the build
# backend too, so the project itself installs with neither dependencies nor an isolated
# build that would fetch anything unpinned.
COPY requirements.lock ./
RUN pip install --require-hashes --only-binary :all: -r requirements.lock
COPY pyproject.toml README.md ./
COPY app ./app
# /app/var holds the state file (VRAM zone holds); compose mounts a volume there, which
# takes this directory's owner, so it must exist and belong to the gateway's user.
RUN pip install --no-deps --no-build-isolation . \
    && useradd --system --uid 10001 microscheduler \
    && mkdir -p /app/var && chown microscheduler /app/var
COPY config ./config

USER microscheduler
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s \
  CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2)" || exit 1
CMD ["microscheduler", "serve"]
