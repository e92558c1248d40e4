# sglang-oom-exporter container image: the package installed from this repository with `pip install .`.
# Build: docker build -t sglang-oom-exporter:0.1.0 --build-arg VERSION=0.1.0 .
# Runs as a non-root user (uid 65532) with nothing to write but the state directory, so it works with a
# read-only root filesystem. The Helm chart's DaemonSet runs it as uid 0 instead, because kubelet's pod logs
# under /var/log/pods are root-owned and not world-readable (every capability is still dropped there).
# BASE_IMAGE: any image with python3 (3.10+) and its venv module; CI builds with a Debian root filesystem
# made by mmdebstrap (docs/container-image.md), because it can pull no image.
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
RUN python3 -m venv /opt/sglang-oom-exporter \
 && /opt/sglang-oom-exporter/bin/pip install --no-cache-dir --disable-pip-version-check . \
 && /opt/sglang-oom-exporter/bin/sglang-oom-exporter scan --sample >/dev/null

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="sglang-oom-exporter" \
      org.opencontainers.image.description="SGLang KV-cache OOM events from logs as Prometheus metrics, with the fix for each." \
      org.opencontainers.image.source="https://github.com/sglang-oom-exporter/sglang-oom-exporter" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /opt/sglang-oom-exporter /opt/sglang-oom-exporter
# No .pyc files at run time (the root filesystem is read-only); logs straight to the container runtime.
ENV PATH="/opt/sglang-oom-exporter/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The state directory is the only path the exporter writes (mount a volume there to keep positions).
RUN mkdir -p /var/lib/sglang-oom-exporter && chown 65532:65532 /var/lib/sglang-oom-exporter
USER 65532:65532
WORKDIR /var/lib/sglang-oom-exporter
EXPOSE 9877
ENTRYPOINT ["sglang-oom-exporter"]
CMD ["serve", "--state-dir=/var/lib/sglang-oom-exporter", "--kubernetes-logs=/var/log/pods"]
