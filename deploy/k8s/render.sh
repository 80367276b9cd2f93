#!/usr/bin/env bash
# Render every kustomization under deploy/k8s (not the components) into OUT_DIR, one file each,
# for the static checks: `deploy/k8s/render.sh OUT_DIR`. The certificates and keys that operators
# provide (gitignored) are replaced by placeholder files in a scratch copy, so this needs none.
set -euo pipefail
out=${1:?usage: deploy/k8s/render.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -r "$here/." "$scratch/"
rm -rf "$scratch"/base/coordinator/tls "$scratch"/overlays/*/identity
mkdir -p "$out"
rendered=0
while IFS= read -r kfile; do
  dir=$(dirname "$kfile")
  rel=${dir#"$scratch"/}
  grep -q '^kind: Component' "$kfile" && continue
  # Every file a secretGenerator names, as a placeholder.
  awk '/^secretGenerator:/{s=1; next} /^[a-zA-Z]/{s=0} s && /^ *- [^ ]+\.(crt|key)$/{print $2}' \
    "$kfile" | while IFS= read -r f; do
      mkdir -p "$(dirname "$dir/$f")"
      printf 'placeholder for %s\n' "$f" > "$dir/$f"
    done
  kubectl kustomize "$dir" > "$out/${rel//\//_}.yaml"
  echo "rendered $rel"
  rendered=$((rendered + 1))
done < <(find "$scratch" -name kustomization.yaml | sort)
[ "$rendered" -gt 0 ] || { echo "no kustomization found under $here" >&2; exit 1; }
