#!/usr/bin/env bash
# A standing federation on this machine, step by step with the same commands operators use:
# synthetic data for three silos from different domains, a throwaway CA, three silo identities
# and an operator's; a standing coordinator and three standing silos talking mTLS on loopback;
# two jobs submitted one after the other (FedStar, then FedAvg) without restarting anything,
# one site approving by hand; then the results and the audit check.
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

echo "== 2. identities: the coordinator's CA; each silo makes its key and CSR, the CA signs;"
echo "      an operator's identity, whose key signs the jobs it submits"
coordinator pki init --dir "$RUN/ca" --host localhost --host 127.0.0.1 --federation demo
for s in "${SILOS[@]}"; do
  silo pki request --name "$s" --dir "$RUN/$s/id"
  coordinator pki sign "$RUN/$s/id/$s.csr" --ca "$RUN/ca"
done
coordinator pki operator --name ops-demo --ca "$RUN/ca" --out "$RUN/ops-demo"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$RUN/deployment.toml" <<DEPLOYMENT
[deployment]
name = "demo"
silos = ["hospital-a", "pharma-b", "social-c"]
operators = ["ops-demo"]

[server]
listen = "127.0.0.1:$PORT"
ca_cert = "ca/ca.crt"
server_cert = "ca/server.crt"
server_key = "ca/server.key"
state_root = "coordinator-state"
DEPLOYMENT

echo "== 3. a standing coordinator and three standing silos (each approves jobs by its policy;"
echo "      social-c holds them for its operator)"
coordinator serve --deployment "$RUN/deployment.toml" 2> "$RUN/coordinator.log" &
COORD=$!
PIDS=()
trap 'kill $COORD "${PIDS[@]}" 2>/dev/null || true' EXIT
for i in 0 1 2; do
  s=${SILOS[$i]}
  approve=$([ "$s" = social-c ] && echo manual || echo auto)
  printf '[jobs]\napprove = "%s"\noperators = ["ops-demo"]\n' "$approve" > "$RUN/$s/policy.toml"
  silo serve --coordinator "127.0.0.1:$PORT" --identity "$RUN/$s/id" \
    --data "graphs=$RUN/$s/graphs" --policy "$RUN/$s/policy.toml" \
    --state-root "$RUN/$s/state" --threads 1 --device auto 2> "$RUN/$s/silo.log" &
  PIDS+=($!)
done

export TRELLIS_COORDINATOR="127.0.0.1:$PORT" TRELLIS_IDENTITY="$RUN/ops-demo"
job_plan() {   # algorithm rounds: a job plan (a plan without [server], naming the dataset)
  cat <<PLAN
[federation]
id = "demo-$1"
algorithm = "$1"
dataset = "graphs"
rounds = $2
seed = 1
silos = ["hospital-a", "pharma-b", "social-c"]

[timeouts]
join_s = 120
round_s = 300
PLAN
}
job_plan fedstar "$ROUNDS" > "$RUN/fedstar.toml"
job_plan fedavg 10 > "$RUN/fedavg.toml"
for _ in $(seq 1 100); do
  coordinator jobs list > /dev/null 2>&1 && break
  sleep 0.2
done

echo "== 4. the operator submits two jobs; social-c's operator approves each"
coordinator jobs submit "$RUN/fedstar.toml"
coordinator jobs submit "$RUN/fedavg.toml"
for job in 1 2; do
  until silo jobs show "$job" --state-root "$RUN/social-c/state" > /dev/null 2>&1; do
    sleep 0.2
  done
  silo jobs approve "$job" --state-root "$RUN/social-c/state"
done

echo "== 5. job 1's log as it runs, then job 2's"
coordinator jobs logs 1 --follow
coordinator jobs logs 2 --follow
coordinator jobs list

echo "== 6. results: each job's accuracy per silo (final round, reported by the silos), files"
for job in 1 2; do
  coordinator jobs results "$job" --out "$RUN/results/job-$job"
done

echo "== 7. audit logs (hash chains and signed checkpoints): the deployment's, each job's"
coordinator audit verify "$RUN/coordinator-state/audit.jsonl" --cert "$RUN/ca/server.crt"
for job in 1 2; do
  coordinator audit verify "$RUN/coordinator-state/jobs/$job/audit.jsonl" \
    --cert "$RUN/ca/server.crt"
  for s in "${SILOS[@]}"; do
    coordinator audit verify "$RUN/$s/state/jobs/$job/audit.jsonl" --cert "$RUN/$s/id/$s.crt"
  done
done
kill "${PIDS[@]}" "$COORD"
wait "${PIDS[@]}" "$COORD" 2>/dev/null || true
trap - EXIT
echo "demo finished: the standing coordinator and silos are stopped; everything is under $RUN/"
