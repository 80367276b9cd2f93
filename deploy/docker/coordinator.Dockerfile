# The coordinator image: Trellis without torch (the coordinator aggregates masked tensors; it
# never trains). Build it from the repository root:
#   docker build -f deploy/docker/coordinator.Dockerfile -t trellis/coordinator .
# BASE_IMAGE: any Debian-based image with Python 3.11 or newer and its venv module (docs/deploy.md).
# EXTRAS: extras of the project to add; EXTRAS=privacy for a coordinator that serves private
# plans (their epsilon accountant, dp-accounting, brings scipy: about 150 MB more).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# PIP_NO_INDEX=1: install only from deploy/docker/wheelhouse/ (a build without a registry).
ARG PIP_NO_INDEX
ARG EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/tmp/wheelhouse
COPY deploy/docker/wheelhouse/ /tmp/wheelhouse/
COPY pyproject.toml README.md /src/
COPY silo/ /src/silo/
COPY coordinator/ /src/coordinator/
COPY crypto/ /src/crypto/
COPY protos/ /src/protos/
RUN python3 -m venv /opt/trellis \
    && /opt/trellis/bin/pip install --no-cache-dir "/src${EXTRAS:+[$EXTRAS]}" \
    && /opt/trellis/bin/coordinator --version

# checkov:skip=CKV_DOCKER_7:the tag is the BASE_IMAGE build argument, pinned above (python:3.11-slim-bookworm) or chosen by whoever builds
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="trellis-coordinator" \
      org.opencontainers.image.description="Trellis coordinator: runs the rounds of a federation over mTLS; no torch" \
      org.opencontainers.image.licenses="Apache-2.0"
# The same numeric user as the Kubernetes manifests (runAsUser 10001). A new named volume
# takes the owner of the folder it is mounted on: state, the CA and the CSR exchange of
# deploy/compose, the identities the compose signer writes (server, operator) and the
# operator's downloaded results are the user's.
RUN groupadd --system --gid 10001 trellis \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/trellis --no-create-home \
       --shell /usr/sbin/nologin trellis \
    && mkdir -p /var/lib/trellis/state /var/lib/trellis/ca /var/lib/trellis/exchange \
       /var/lib/trellis/results /etc/trellis/plan /etc/trellis/deployment /etc/trellis/tls \
       /etc/trellis/operator \
    && chown 10001:10001 /var/lib/trellis /var/lib/trellis/state /var/lib/trellis/ca \
       /var/lib/trellis/exchange /var/lib/trellis/results /etc/trellis/tls \
       /etc/trellis/operator
COPY --from=build /opt/trellis /opt/trellis
# HOME=/tmp: nothing writes outside the state volume and /tmp (read-only root file systems).
ENV PATH=/opt/trellis/bin:$PATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    TRELLIS_PROGRESS=0
USER 10001:10001
WORKDIR /var/lib/trellis
VOLUME ["/var/lib/trellis/state"]
# 50051 federation, jobs and operators (mTLS); 8081 plain gRPC health, for probes inside the
# host or pod; 9464 Prometheus metrics when --metrics-listen asks for them.
EXPOSE 50051 8081 9464
# grpc.health.v1 on the plain health port that the default command opens (SERVING while the
# federation runs, or once a --deployment is served); a command that moves --health-listen
# must move this check too.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["coordinator", "health", "--address", "127.0.0.1:8081"]
# Exec form: the coordinator is PID 1 and gets SIGTERM itself; it stops as for Ctrl-C, its
# last round checkpointed, and the same command resumes it.
ENTRYPOINT ["coordinator"]
# The default command: a standing coordinator (its deployment file mounted at
# /etc/trellis/deployment/); a one-plan federation gives `serve --plan ...` instead.
CMD ["serve", "--deployment", "/etc/trellis/deployment/deployment.toml", "--health-listen", \
     "127.0.0.1:8081"]
