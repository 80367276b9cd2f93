#!/usr/bin/env bash
# `make deploy-check`: the images and the compose federation, for real. Builds both images,
# runs the one-plan federation of deploy/compose/one-plan to the end (stopping the coordinator
# once with SIGTERM and starting it again on the way), verifies every audit log, checks that a
# second `up` on the finished federation ends at once, then runs the standing federation of
# deploy/compose (a job submitted by the operator service and approved by hand at social-c, to
# its end and its audit), and prints the image sizes and the wall times.
# Outside `make test`: it installs Docker when missing (Debian's docker.io, as root), starts
# dockerd when none runs (and stops it at the end), and builds images for minutes.
#
# The base image: $BASE_IMAGE if set; else the default base (python:3.11-slim-bookworm) when a
# registry gives it; else one built here from Debian packages (debootstrap, `docker import`).
# With a local base the build installs only wheels downloaded here first (deploy/docker/
# wheelhouse, PIP_NO_INDEX=1): nothing inside the build reaches a package index. PY is the
# Python that downloads them (the project's .venv; its version must be the base's, 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
work=build/deploy-check
project=trellis-deploy-check
default_base=python:3.11-slim-bookworm
local_base=trellis-base:bookworm
targets=(coordinator=400 silo=1500)           # MB, issue "Deploy it the way consortia deploy"
stop_after_round=5                            # the coordinator gets SIGTERM after this round
mkdir -p "$work"
began=$(date +%s)
say() { printf '\n== %s\n' "$*"; }
fail() { echo "deploy-check: FAILED: $*" >&2; exit 1; }

# --- Docker: client, daemon, compose -------------------------------------------------------
started_dockerd=""
compose=()
standing=()
cleanup() {
  local code=$?
  if [ "${#compose[@]}" -gt 0 ] && [ -z "${KEEP:-}" ]; then
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  if [ "${#standing[@]}" -gt 0 ] && [ -z "${KEEP:-}" ]; then
    "${standing[@]}" --profile operator --profile audit down -v --remove-orphans \
      >/dev/null 2>&1 || true
  fi
  if [ -n "$started_dockerd" ] && [ -z "${KEEP:-}" ]; then
    echo "stopping the dockerd this check started (pid $started_dockerd)"
    kill "$started_dockerd" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 0.5; done
  fi
  exit "$code"
}
trap cleanup EXIT

apt_install() {
  [ "$(id -u)" = 0 ] || fail "$* missing, and installing it needs root (apt-get install $*)"
  command -v apt-get >/dev/null || fail "$* missing and no apt-get here: install it yourself"
  say "installing $* (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

say "docker"
if ! command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
  apt_install docker.io
fi
if ! docker info >/dev/null 2>&1; then
  # Addresses from 198.19.0.0/16 (benchmarking range), never the private ranges a host or
  # its network may already route. Stopped again at the end.
  dockerd --bip 198.19.0.1/24 --default-address-pool base=198.19.16.0/20,size=24 \
    --pidfile "$PWD/$work/dockerd.pid" >"$work/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || fail "dockerd did not start; see $work/dockerd.log"
  echo "started dockerd (pid $started_dockerd, log $work/dockerd.log)"
fi
docker version --format 'client {{.Client.Version}}, server {{.Server.Version}}'
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose)
else
  apt_install docker-compose
  compose=(docker-compose)
fi
"${compose[@]}" version | sed -n 1p      # sed reads it all: no SIGPIPE under pipefail
standing=("${compose[@]}" -p "$project-standing" -f deploy/compose/compose.yaml)
compose+=(-p "$project" -f deploy/compose/one-plan/compose.yaml)

# --- the base image -------------------------------------------------------------------------
say "base image"
offline=""
if [ -n "${BASE_IMAGE:-}" ]; then
  base=$BASE_IMAGE
  echo "BASE_IMAGE=$base (given)"
elif timeout 120 docker pull -q "$default_base" >/dev/null 2>&1; then
  base=$default_base
  echo "$base (pulled from its registry)"
else
  base=$local_base
  offline=1
  echo "no registry gives $default_base: using $base, built here from Debian packages"
  if ! docker image inspect "$base" >/dev/null 2>&1 || [ -n "${REBUILD_BASE:-}" ]; then
    command -v debootstrap >/dev/null || apt_install debootstrap
    rootfs=$work/rootfs
    rm -rf "$rootfs"
    t0=$(date +%s)
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
      || fail "debootstrap failed; see $work/debootstrap.log"
    # What an image needs no copy of: package lists, caches, documentation.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
      "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc/* \
      "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
    tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' \
      - "$base" >/dev/null
    rm -rf "$rootfs"
    echo "built $base in $(( $(date +%s) - t0 )) s (debootstrap bookworm, minbase + python3)"
  else
    echo "$base exists already (REBUILD_BASE=1 builds it again)"
  fi
fi

build_args=(--build-arg "BASE_IMAGE=$base")
if [ -n "$offline" ]; then
  say "wheels for an offline build (deploy/docker/wheelhouse)"
  [ -x "$PY" ] || fail "$PY not found: run make first, or set PY"
  "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    || fail "$PY is not Python 3.11, the local base's: its wheels would not install there"
  t0=$(date +%s)
  # torch's CPU build (a +cpu wheel) from PyTorch's index where it is reachable, else from
  # what this machine's pip finds; never PyPI's plain torch, which brings GBs of CUDA.
  torch_index=()
  if "$PY" -c 'import urllib.request as u; u.urlopen("https://download.pytorch.org/whl/cpu/torch/", timeout=10)' 2>/dev/null; then
    torch_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  "$PY" -m pip download -q -d deploy/docker/wheelhouse "${torch_index[@]}" 'torch==2.13.0' \
    2>"$work/pip-download.log" || fail "pip download torch failed; see $work/pip-download.log"
  ls deploy/docker/wheelhouse/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 \
    || fail "no CPU build of torch 2.13.0 (torch-2.13.0+cpu-*.whl) in deploy/docker/wheelhouse"
  "$PY" -m pip download -q -d deploy/docker/wheelhouse --find-links deploy/docker/wheelhouse \
    '.[silo]' 'torch==2.13.0' 'setuptools>=68' wheel pip 2>>"$work/pip-download.log" \
    || fail "pip download failed; see $work/pip-download.log"
  if ls deploy/docker/wheelhouse/nvidia_* >/dev/null 2>&1; then
    fail "CUDA wheels (nvidia_*) in deploy/docker/wheelhouse: remove them and run again"
  fi
  echo "$(ls deploy/docker/wheelhouse/*.whl | wc -l) wheels in $(( $(date +%s) - t0 )) s"
  build_args+=(--build-arg PIP_NO_INDEX=1)
fi

# --- the images ------------------------------------------------------------------------------
declare -A build_s size_mb
for target in "${targets[@]}"; do
  image=${target%%=*}
  say "build trellis/$image"
  t0=$(date +%s)
  docker build -q -f "deploy/docker/$image.Dockerfile" "${build_args[@]}" \
    -t "trellis/$image:latest" . >"$work/build-$image.log" 2>&1 \
    || { tail -30 "$work/build-$image.log"; fail "building trellis/$image"; }
  build_s[$image]=$(( $(date +%s) - t0 ))
  size_mb[$image]=$(( $(docker image inspect -f '{{.Size}}' "trellis/$image:latest") / 1000000 ))
  echo "trellis/$image: ${size_mb[$image]} MB, built in ${build_s[$image]} s"
done

say "image checks"
for image in coordinator silo; do
  user=$(docker run --rm --entrypoint id "trellis/$image:latest" -u)
  [ "$user" = 10001 ] || fail "the $image image runs as uid $user, not 10001"
done
docker run --rm --entrypoint python3 trellis/coordinator:latest -c \
  'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is not None)' \
  || fail "the coordinator image has torch"
# Nor scipy: the privacy accountant's (the `privacy` extra, EXTRAS=privacy) is left out by default.
docker run --rm --entrypoint python3 trellis/coordinator:latest -c \
  'import importlib.util, sys; sys.exit(importlib.util.find_spec("scipy") is not None)' \
  || fail "the coordinator image has scipy"
echo "both images: uid 10001; coordinator image: no torch, no scipy; $(docker run --rm trellis/coordinator:latest --version)"
docker run --rm --entrypoint python3 trellis/silo:latest -c \
  'import torch, torch_geometric; print("silo image: torch", torch.__version__, "cuda" if torch.version.cuda else "cpu", "| torch_geometric", torch_geometric.__version__)'

# --- the compose federation ---------------------------------------------------------------
say "compose federation (deploy/compose/one-plan): up"
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
run_began=$(date +%s)
# Detached: returns once the one-shot steps have completed and the coordinator is healthy.
"${compose[@]}" up -d >"$work/compose-up.log" 2>&1 \
  || { cat "$work/compose-up.log"; "${compose[@]}" logs --no-color | tail -40; fail "compose up"; }
cid() { "${compose[@]}" ps -a -q "$1"; }    # -a: compose v2 lists running ones only
coordinator=$(cid coordinator)
for step in hospital-a-init pharma-b-init social-c-init signer hospital-a-enrol pharma-b-enrol \
            social-c-enrol; do
  code=$(docker inspect -f '{{.State.ExitCode}}' "$(cid "$step")")
  [ "$code" = 0 ] || fail "$step exited with $code"
done
echo "keys, CSRs, signing and enrolment done; the coordinator is healthy:" \
  "$(docker inspect -f '{{.State.Health.Status}}' "$coordinator")"

say "compose federation: docker stop the coordinator after round $stop_after_round, start it again"
for _ in $(seq 600); do
  docker logs "$coordinator" 2>&1 | grep "round $stop_after_round/[0-9]* done" >/dev/null && break
  [ "$(docker inspect -f '{{.State.Running}}' "$coordinator")" = true ] \
    || fail "the coordinator ended before round $stop_after_round"
  sleep 0.5
done
docker logs "$coordinator" 2>&1 | grep "round $stop_after_round/[0-9]* done" >/dev/null \
  || fail "round $stop_after_round did not end within 5 minutes"
t0=$(date +%s)
"${compose[@]}" stop -t 60 coordinator >"$work/compose-stop.log" 2>&1 \
  || { cat "$work/compose-stop.log"; fail "compose stop coordinator"; }
code=$(docker inspect -f '{{.State.ExitCode}}' "$coordinator")
echo "stopped in $(( $(date +%s) - t0 )) s, exit code $code:"
docker logs "$coordinator" 2>&1 | grep "stopped (SIGTERM)" || fail "no 'stopped (SIGTERM)' line"
# The stop's safety net (protos/stop.py) names what held the exit up, if anything did.
docker logs "$coordinator" 2>&1 | grep "still running after" || true
[ "$code" = 143 ] || fail "the coordinator exited $code on SIGTERM, not 143"
"${compose[@]}" start coordinator >"$work/compose-start.log" 2>&1 \
  || { cat "$work/compose-start.log"; fail "compose start coordinator"; }

say "compose federation: to the end"
declare -A exit_code
for service in coordinator hospital-a pharma-b social-c; do
  exit_code[$service]=$(docker wait "$(cid "$service")")
done
run_s=$(( $(date +%s) - run_began ))
"${compose[@]}" logs --no-color >"$work/compose.log" 2>&1 || true
docker logs "$coordinator" 2>&1 | grep "resuming federation" \
  || fail "the restarted coordinator did not resume from its checkpoint"
docker logs "$coordinator" 2>&1 | tail -8
for service in coordinator hospital-a pharma-b social-c; do
  echo "$service exited with ${exit_code[$service]}"
  [ "${exit_code[$service]}" = 0 ] || { tail -40 "$work/compose.log"; fail "$service"; }
done

say "audit logs (docker compose run --rm audit)"
"${compose[@]}" run --rm audit >"$work/audit.log" 2>&1 \
  || { cat "$work/audit.log"; fail "an audit log does not verify"; }
grep -E "^(audit log|OK)" "$work/audit.log"

say "compose federation: a second 'up' on the finished federation ends at once"
# The coordinator finds its federation finished and exits 0. Compose then either refuses to
# start the silos (the coordinator is not healthy: `up` fails, as Compose 1.29 with Docker 20
# does) or starts them anyway (some Compose versions count an exited container as healthy):
# each silo then finds its federation finished and no coordinator, says so and exits 0
# (silo/federation/finished.py). Either way nothing is left running.
again_began=$(date +%s)
timeout 300 "${compose[@]}" up -d >"$work/compose-up-again.log" 2>&1 \
  || echo "compose up returned $? ($(grep -c unhealthy "$work/compose-up-again.log") line(s) name the finished coordinator unhealthy)"
code=$(timeout 120 docker wait "$(cid coordinator)") \
  || fail "the coordinator still runs 120 s after a second 'up' on the finished federation"
[ "$code" = 0 ] || fail "the coordinator exited with $code on the second 'up'"
docker logs "$(cid coordinator)" 2>&1 | grep "has finished" | tail -1 \
  || fail "the coordinator did not say its federation has finished"
for service in hospital-a pharma-b social-c; do
  [ "$(docker inspect -f '{{.State.Running}}' "$(cid "$service")")" = true ] || continue
  code=$(timeout 120 docker wait "$(cid "$service")") \
    || fail "$service still runs 120 s after a second 'up' on the finished federation"
  [ "$code" = 0 ] || { "${compose[@]}" logs --no-color "$service" | tail -20;
                       fail "$service exited with $code on the second 'up'"; }
  docker logs "$(cid "$service")" 2>&1 | grep "nothing to join" | tail -1 \
    || fail "$service did not say there is nothing to join"
done
again_s=$(( $(date +%s) - again_began ))
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true

# --- the standing federation ----------------------------------------------------------------
say "standing compose (deploy/compose): up; the operator submits a job, social-c approves it"
"${standing[@]}" --profile operator --profile audit down -v --remove-orphans \
  >/dev/null 2>&1 || true
standing_began=$(date +%s)
"${standing[@]}" up -d >"$work/standing-up.log" 2>&1 \
  || { cat "$work/standing-up.log"; "${standing[@]}" logs --no-color | tail -40;
       fail "standing compose up"; }
"${standing[@]}" run --rm operator jobs submit /etc/trellis/jobs/fedstar.toml \
  2>"$work/standing-submit.log" || { cat "$work/standing-submit.log"; fail "jobs submit"; }
for _ in $(seq 120); do
  "${standing[@]}" exec -T social-c silo jobs show 1 --state-root /var/lib/trellis/state \
    >/dev/null 2>&1 && break
  sleep 0.5
done
"${standing[@]}" exec -T social-c silo jobs approve 1 --state-root /var/lib/trellis/state \
  || fail "silo jobs approve at social-c"
timeout 900 "${standing[@]}" run --rm operator jobs logs 1 --follow >"$work/standing-job.log" \
  2>&1 || { tail -20 "$work/standing-job.log"; fail "jobs logs --follow"; }
"${standing[@]}" run --rm operator jobs show 1 >"$work/standing-show.log" 2>&1 || true
grep "^job 1" "$work/standing-show.log" || true
grep -q "^job 1: completed" "$work/standing-show.log" \
  || { cat "$work/standing-show.log"; "${standing[@]}" logs --no-color | tail -40;
       fail "the standing federation's job did not complete"; }
"${standing[@]}" run --rm audit >"$work/standing-audit.log" 2>&1 \
  || { cat "$work/standing-audit.log"; fail "an audit log of the standing federation"; }
grep -c "^OK" "$work/standing-audit.log" | sed 's/$/ audit logs verified/'
for service in coordinator hospital-a pharma-b social-c; do
  [ "$(docker inspect -f '{{.State.Running}}' "$("${standing[@]}" ps -q "$service")")" = true ] \
    || fail "$service of the standing federation is not running after its job"
done
standing_s=$(( $(date +%s) - standing_began ))
"${standing[@]}" --profile operator --profile audit down -v --remove-orphans >/dev/null 2>&1 \
  || true

say "summary"
for target in "${targets[@]}"; do
  image=${target%%=*}
  limit=${target#*=}
  verdict="within the $limit MB target"
  [ "${size_mb[$image]}" -lt "$limit" ] || verdict="OVER the $limit MB target"
  printf '%-20s %5d MB  %s  (built in %d s)\n' "trellis/$image" "${size_mb[$image]}" \
    "$verdict" "${build_s[$image]}"
done
echo "base image: $base"
echo "compose federation: ${run_s} s from 'up' to the last exit (one coordinator stop included)"
echo "second 'up' on the finished federation: every service ended with 0 in ${again_s} s"
echo "standing compose: ${standing_s} s from 'up' to its job completed and audited"
echo "deploy-check: $(( $(date +%s) - began )) s in all"
for target in "${targets[@]}"; do
  image=${target%%=*}
  [ "${size_mb[$image]}" -lt "${target#*=}" ] || fail "trellis/$image is too large"
done
echo "deploy-check: passed"
