# One image recipe for every Tangram service; each image installs only its service's extras.
#   docker build --build-arg SERVICE_EXTRAS=allocator -t tangram-allocator .
#   docker build --build-arg SERVICE_EXTRAS=discovery,partitioner,cdi -t tangram-node .
# The container runs `python -m services.$SERVICE` (SERVICE is set at run time), or the NATS server
# of the `embedded` extra when SERVICE=nats (docker-compose.yml).
# BASE_IMAGE is any Debian-like image with Python 3.11+ as `python3`, its venv module, CA certificates
# and useradd: the public Python image by default; the tests build on one made from Debian's own
# packages (tangram.local.docker), so the stack builds from nothing but package registries.

ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG SERVICE_EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/tangram
WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs ./libs
COPY services ./services
# A regular (not editable) install: the runtime stage needs the venv only, not the sources.
RUN if [ -n "$SERVICE_EXTRAS" ]; then target=".[$SERVICE_EXTRAS]"; else target="."; fi \
    && /opt/tangram/bin/pip install "$target"

FROM ${BASE_IMAGE}
ARG SERVICE_EXTRAS=""
LABEL org.opencontainers.image.title="tangram" \
      org.opencontainers.image.description="Tangram DRA driver for NVIDIA GPUs" \
      dev.tangram.extras="${SERVICE_EXTRAS}"
RUN groupadd --system --gid 10001 tangram \
    && useradd --system --uid 10001 --gid tangram --home-dir /nonexistent --shell /usr/sbin/nologin tangram
# Owned by the service user so that named volumes mounted here (docker compose) are writable.
RUN mkdir -p /var/lib/tangram /var/lib/nats /var/run/cdi /var/lib/kubelet/plugins /var/lib/kubelet/plugins_registry \
    && chown 10001:10001 /var/lib/tangram /var/lib/nats /var/run/cdi /var/lib/kubelet/plugins \
       /var/lib/kubelet/plugins_registry
COPY --from=build /opt/tangram /opt/tangram
COPY deploy/docker/entrypoint.sh /usr/local/bin/tangram-entrypoint
ENV PATH=/opt/tangram/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SERVICE=allocator
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/tangram-entrypoint"]
