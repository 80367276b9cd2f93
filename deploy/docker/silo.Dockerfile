# The silo image: Trellis with torch and torch-geometric. Build it from the repository root:
#   docker build -f deploy/docker/silo.Dockerfile -t trellis/silo .
# CPU torch by default; for NVIDIA GPUs, the CUDA build of torch (docs/getting-started.md):
#   docker build -f deploy/docker/silo.Dockerfile -t trellis/silo:cuda \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
# BASE_IMAGE: any Debian-based image with Python 3.11 or newer and its venv module; CUDA builds
# of torch carry their CUDA libraries, so the host needs only the NVIDIA driver and container
# toolkit (docs/deploy.md).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
# Where torch comes from: the CPU wheels by default (no CUDA libraries, a fifth of the size).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# PIP_NO_INDEX=1: install only from deploy/docker/wheelhouse/ (a build without a registry).
ARG PIP_NO_INDEX
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/tmp/wheelhouse
COPY deploy/docker/wheelhouse/ /tmp/wheelhouse/
# torch alone first, from its index only: a torch from PyPI would bring several GB of CUDA.
RUN python3 -m venv /opt/trellis \
    && /opt/trellis/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
       "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md /src/
COPY silo/ /src/silo/
COPY coordinator/ /src/coordinator/
COPY crypto/ /src/crypto/
COPY protos/ /src/protos/
RUN /opt/trellis/bin/pip install --no-cache-dir "/src[silo]" \
    && /opt/trellis/bin/silo --version

# checkov:skip=CKV_DOCKER_7:the tag is the BASE_IMAGE build argument, pinned above (python:3.11-slim-bookworm) or chosen by whoever builds
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="trellis-silo" \
      org.opencontainers.image.description="Trellis silo agent: trains on the organisation's graphs, shares only masked tensors" \
      org.opencontainers.image.licenses="Apache-2.0"
# The Kubernetes manifests' user (runAsUser 10001). A new named volume takes the owner of the
# folder it is mounted on, so the key, the demo data and the state deploy/compose keeps in
# volumes are the user's.
RUN groupadd --system --gid 10001 trellis \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/trellis --no-create-home \
       --shell /usr/sbin/nologin trellis \
    && mkdir -p /var/lib/trellis/state /var/lib/trellis/exchange /etc/trellis/identity \
       /etc/trellis/policy /data \
    && chown 10001:10001 /var/lib/trellis /var/lib/trellis/state /var/lib/trellis/exchange \
       /etc/trellis/identity /data
COPY --from=build /opt/trellis /opt/trellis
# XDG_CACHE_HOME on the state volume: the dense-layer path the silo measures once
# (silo/models/dense.py) survives restarts, so a resumed silo goes on with the same arithmetic.
ENV PATH=/opt/trellis/bin:$PATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    TRELLIS_PROGRESS=0 XDG_CACHE_HOME=/var/lib/trellis/state/.cache
USER 10001:10001
WORKDIR /var/lib/trellis
VOLUME ["/var/lib/trellis/state"]
# Prometheus metrics when --metrics-listen asks for them; a silo listens for nothing else.
EXPOSE 9465
# A silo serves nothing to probe: it dials the coordinator, which drops it at the round's
# deadline if it stalls; keepalive pings end a dead link. `silo serve` stays up and reconnects
# (restart it always); `silo join` exits when its federation ends (restart it only on
# failure). Watch a federation with `silo join --metrics-listen` instead.
HEALTHCHECK NONE
# Exec form: the silo is PID 1 and gets SIGTERM itself; it stops as for Ctrl-C and the same
# command goes on from its last round.
ENTRYPOINT ["silo"]
CMD ["--help"]
