# syntax=docker/dockerfile:1
# specdecode-exporter: Prometheus sidecar for vLLM speculative-decoding metrics.
#   docker build -t specdecode-exporter:0.1.0 .        (or: scripts/build-image.sh, daemonless, with buildah)
#   docker run --rm -p 9877:9877 specdecode-exporter:0.1.0 run --target http://host:8000/metrics
# Runs as a numeric non-root user, needs no writable path (read-only root filesystem works), no compiler.
ARG PYTHON_BASE=docker.io/library/python:3.11-slim-bookworm

# ---- build: a virtual environment with pinned binary wheels and the exporter ----
FROM ${PYTHON_BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python3 -m venv /opt/venv
COPY deploy/image/requirements.txt /src/requirements.txt
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps --only-binary=:all: -r /src/requirements.txt
COPY pyproject.toml README.md LICENSE /src/
COPY src /src/src
# The exporter is pure Python: install it without dependencies (they are pinned above), check the closure,
# byte-compile everything now (the final root filesystem is read-only), and drop the installers.
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps /src \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/pip uninstall --yes pip setuptools \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

# ---- final: the slim base, the virtual environment, nothing else ----
FROM ${PYTHON_BASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="specdecode-exporter" \
      org.opencontainers.image.description="Prometheus sidecar that tells you whether vLLM speculative decoding is paying off" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# 65532 = "nonroot" in distroless images; numeric so that Kubernetes can verify runAsNonRoot.
USER 65532:65532
EXPOSE 9877
# Liveness only (/healthz). The port follows SPECDECODE_WEB_LISTEN_ADDRESS when that is set.
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; port = os.environ.get('SPECDECODE_WEB_LISTEN_ADDRESS', ':9877').rsplit(':', 1)[1]; urllib.request.urlopen('http://127.0.0.1:' + port + '/healthz', timeout=2)"]
ENTRYPOINT ["specdecode-exporter"]
CMD ["run"]
