#!/usr/bin/env bash
# Static checks of deploy/ (`make check-deploy`, part of `make test`): render every kustomization,
# yamllint, checkov on the rendered manifests and on deploy/, hadolint on Dockerfiles,
# `systemd-analyze verify` on the systemd units. TOOLS is the folder of the linters' virtual
# environment (the Makefile's .venv-tools). A missing system tool is a skip line, not a failure.
set -euo pipefail
tools=${TOOLS:?TOOLS=path of the linters environment, e.g. .venv-tools}
cd "$(dirname "$0")/.."
work=build/check-deploy
rm -rf "$work"
mkdir -p "$work"
# checkov: no calls home (no network on CI; results stay here).
export BC_SKIP_MAPPING=TRUE CHECKOV_RUN_SCA_PACKAGE_SCAN_V2=false
checkov=("$tools/bin/checkov" --skip-download --compact --quiet)

echo "== kustomize: render deploy/k8s"
if command -v kubectl >/dev/null; then
  deploy/k8s/render.sh "$work/rendered"
else
  echo "SKIPPED: kubectl not found; the Kubernetes manifests are neither rendered nor scanned"
fi

echo "== yamllint deploy/"
"$tools/bin/yamllint" -c deploy/.yamllint -s deploy/

echo "== checkov (kubernetes) on the rendered manifests"
if [ -d "$work/rendered" ]; then
  "${checkov[@]}" --framework kubernetes -d "$work/rendered"
else
  echo "SKIPPED: nothing rendered"
fi

echo "== checkov (dockerfile) on deploy/"
# The kustomize sources are checked rendered, above: raw patches would be judged incomplete.
"${checkov[@]}" --framework dockerfile -d deploy --skip-path deploy/k8s

echo "== hadolint"
mapfile -t dockerfiles < <(find . -path ./.git -prune -o -path './.venv*' -prune \
  -o -type f \( -name Dockerfile -o -name 'Dockerfile.*' -o -name '*.Dockerfile' \) -print)
if [ "${#dockerfiles[@]}" -gt 0 ]; then
  "$tools/bin/hadolint" "${dockerfiles[@]}"
  echo "hadolint: ${#dockerfiles[@]} Dockerfile(s) clean"
else
  echo "no Dockerfile yet"
fi

echo "== systemd-analyze verify deploy/systemd"
if command -v systemd-analyze >/dev/null; then
  # verify insists that ExecStart's program exists: the units are checked as copies whose
  # /srv/trellis/.venv/bin/ points at stub programs. It also exits 0 on unknown keys and
  # sections, so any line it prints is a failure. The standing units and the one-plan ones
  # (deploy/systemd/one-plan/) share names: each folder is verified on its own.
  stubs="$PWD/$work/systemd/bin"
  mkdir -p "$stubs"
  for program in coordinator silo; do
    printf '#!/bin/sh\n' > "$stubs/$program"
    chmod +x "$stubs/$program"
  done
  verified=0
  while IFS= read -r folder; do
    copies="$work/systemd/units/${folder//\//_}"
    mkdir -p "$copies"
    for unit in "$folder"/*.service; do
      sed "s#/srv/trellis/.venv/bin/#$stubs/#g" "$unit" > "$copies/${unit##*/}"
      verified=$((verified + 1))
    done
    report=$(systemd-analyze verify "$copies"/*.service 2>&1) || true
    if [ -n "$report" ]; then
      echo "$report"
      exit 1
    fi
  done < <(find deploy/systemd -name '*.service' -printf '%h\n' | sort -u)
  echo "systemd-analyze: $verified unit(s) clean"
else
  echo "SKIPPED: systemd-analyze not found; the systemd units are not verified"
fi
echo "check-deploy: all checks passed"
