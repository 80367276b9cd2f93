#!/usr/bin/env bash
# A real federation on this machine, step by step with the same commands operators use:
# synthetic data for three silos from different domains, a throwaway CA, three silo identities,
# a coordinator and three silo processes talking mTLS on loopback, FedStar, then the audit check.
set -euo pipefail
RUN=${DEMO_DIR:-demo-run}
ROUNDS=${DEMO_ROUNDS:-30}
rm -rf "$RUN"
mkdir -p "$RUN"
SILOS=(hospital-a pharma-b social-c)
DOMAINS=(molecules bio social)

echo "== 1. synthetic graph data (one domain per silo; nothing is downloaded)"
for i in 0 1 2; do
  silo make-demo-data --out "$RUN/${SILOS[$i]}/graphs" --domain "${DOMAINS[$i]}" \
    --graphs 300 --seed $((i + 1))
done

echo "== 2. identities: the coordinator's CA; each silo makes its key and CSR, the CA signs"
coordinator pki init --dir "$RUN/ca" --host localhost --host 127.0.0.1 --federation demo
for s in "${SILOS[@]}"; do
  silo pki request --name "$s" --dir "$RUN/$s/id"
  coordinator pki sign "$RUN/$s/id/$s.csr" --ca "$RUN/ca"
done

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$RUN/plan.toml" <<PLAN
[federation]
id = "demo-fedstar"
algorithm = "fedstar"
rounds = $ROUNDS
seed = 1
min_silos = 3
silos = ["hospital-a", "pharma-b", "social-c"]

[server]
listen = "127.0.0.1:$PORT"
ca_cert = "ca/ca.crt"
server_cert = "ca/server.crt"
server_key = "ca/server.key"
state_dir = "coordinator-state"

[timeouts]
join_s = 120
round_s = 300
PLAN

echo "== 3. coordinator and three silo processes (one core-share each, passive OpenMP waits)"
coordinator serve --plan "$RUN/plan.toml" > "$RUN/coordinator.out" &
COORD=$!
PIDS=()
for s in "${SILOS[@]}"; do
  silo join --coordinator "127.0.0.1:$PORT" --data "$RUN/$s/graphs" --identity "$RUN/$s/id" \
    --state-dir "$RUN/$s/state" --threads 1 --device auto 2> "$RUN/$s/silo.log" &
  PIDS+=($!)
done
trap 'kill $COORD "${PIDS[@]}" 2>/dev/null || true' EXIT
for p in "${PIDS[@]}"; do wait "$p"; done
wait $COORD
trap - EXIT

echo "== 4. per-silo accuracy (final round, reported by the silos themselves)"
cat "$RUN/coordinator.out"

echo "== 5. audit logs (hash chains and signed checkpoints)"
coordinator audit verify "$RUN/coordinator-state/audit.jsonl" --cert "$RUN/ca/server.crt"
for s in "${SILOS[@]}"; do
  coordinator audit verify "$RUN/$s/state/audit.jsonl" --cert "$RUN/$s/id/$s.crt"
done
echo "demo finished: everything is under $RUN/"
