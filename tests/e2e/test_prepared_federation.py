"""End to end: three silos each prepare their own molecules (two SMILES tables, one SDF file)
with `silo data prepare`, and a real federation over mTLS trains on the prepared folders; a
fourth silo, prepared with a different featuriser setting (--standardise), refuses the plan's
reference-set fingerprint before it sends anything (issue "Bring your own graphs")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.federation import (
    Workspace,
    free_port,
    start_coordinator,
    start_silo,
    wait_all,
)
from trellis.crypto.audit import verify_audit_log
from trellis.crypto.audit_crosscheck import read_records
from trellis.crypto.pki import init_ca, request_identity, sign_request

pytestmark = pytest.mark.slow
chem = pytest.importorskip("rdkit.Chem")

SILOS = ("hospital-a", "pharma-b", "lab-c")
ODD = "clinic-d"                   # prepares with --standardise: another fingerprint


def molecules(offset: int) -> list[tuple[str, int]]:
    """Aromatic (label 1) and aliphatic (label 0) molecules: the label is learnable."""
    found = []
    for n in range(1 + offset, 13 + offset):
        chain = "C" * n
        found += [(f"c1ccccc1{chain}", 1), (f"c1ccncc1{chain}", 1), (f"Oc1ccccc1{chain}", 1),
                  (f"{chain}O", 0), (f"{chain}N", 0), (f"C1CCCCC1{chain}", 0)]
    return found


def write_smiles(path: Path, offset: int) -> Path:
    rows = ["smiles,label"] + [f"{s},{y}" for s, y in molecules(offset)]
    rows.insert(5, "C1CC,0")        # an invalid SMILES: refused and listed, not fatal
    path.write_text("\n".join(rows) + "\n")
    return path


def write_sdf(path: Path, offset: int) -> Path:
    writer = chem.SDWriter(str(path))
    for i, (smiles, label) in enumerate(molecules(offset)):
        mol = chem.MolFromSmiles(smiles)
        mol.SetProp("_Name", f"m{i}")
        mol.SetProp("active", str(label))
        writer.write(mol)
    writer.close()
    return path


def prepare(source: Path, out: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trellis.silo.cli", "data", "prepare",
                           str(source), "--out", str(out), *options],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    root = tmp_path_factory.mktemp("prepared-federation")
    ws = Workspace(root, (*SILOS, ODD))
    init_ca(ws.ca, ["localhost", "127.0.0.1"])
    for silo in ws.silos:
        sign_request(request_identity(silo, ws.identity(silo)), ws.ca)
    sources = root / "sources"
    sources.mkdir()
    made = {
        "hospital-a": prepare(write_smiles(sources / "a.csv", 0), ws.data("hospital-a")),
        "pharma-b": prepare(write_sdf(sources / "b.sdf", 1), ws.data("pharma-b"),
                            "--label-property", "active"),
        "lab-c": prepare(write_smiles(sources / "c.csv", 2), ws.data("lab-c")),
        ODD: prepare(write_smiles(sources / "d.csv", 3), ws.data(ODD), "--standardise"),
    }
    for silo, done in made.items():
        assert done.returncode == 0, (silo, done.stderr)
    assert "1 row(s) refused" in made["hospital-a"].stdout
    return ws


def fingerprint(folder: Path) -> str:
    return json.loads((folder / "manifest.json").read_text())["fingerprint"]


def test_three_prepared_silos_federate_and_a_differently_prepared_one_refuses(
        ws: Workspace) -> None:
    required = subprocess.run([sys.executable, "-m", "trellis.silo.cli", "data", "fingerprint"],
                              capture_output=True, text=True, timeout=120).stdout.split()[0]
    assert all(fingerprint(ws.data(s)) == required for s in SILOS)
    assert fingerprint(ws.data(ODD)) != required
    port = free_port()
    plan = ws.root / "plan.toml"
    plan.write_text(f"""
[federation]
id = "prepared"
algorithm = "fedstar"
rounds = 3
seed = 7
min_silos = 3
silos = [{", ".join(f'"{s}"' for s in ws.silos)}]

[data]
reference_sha256 = "{required}"

[server]
listen = "127.0.0.1:{port}"
ca_cert = "{ws.ca / 'ca.crt'}"
server_cert = "{ws.ca / 'server.crt'}"
server_key = "{ws.ca / 'server.key'}"
state_dir = "{ws.root / 'coordinator'}"

[timeouts]
join_s = 40
round_s = 120
report_s = 30
""")
    logs = ws.root / "logs"
    logs.mkdir()
    coordinator = start_coordinator(plan, logs / "coordinator.log")
    silos = [start_silo(ws, s, port, ws.root / "state" / s, logs / f"{s}.log")
             for s in ws.silos]
    codes = wait_all([*silos, coordinator], timeout=300)
    said = {p.name: p.read_text() for p in logs.glob("*.log")}
    assert codes[:3] == [0, 0, 0] and codes[4] == 0, (codes, said)
    # The odd silo: refused the plan before anything was sent, naming both fingerprints, and
    # exited 2 (a mistake retrying cannot fix), not 1 (a failed federation).
    assert codes[3] == 2, said[f"{ODD}.log"]
    assert required in said[f"{ODD}.log"] and fingerprint(ws.data(ODD)) in said[f"{ODD}.log"]
    odd_log = ws.root / "state" / ODD / "audit.jsonl"
    verify_audit_log(odd_log)
    events = [r["event"] for _, r in read_records(odd_log)]
    assert "refused_to_continue" in events
    assert not {"masked_input", "key_advertised", "upload"} & set(events)
    results = json.loads((ws.root / "coordinator" / "results.json").read_text())
    assert results["status"] == "completed" and len(results["rounds"]) == 3
    assert set(results["final_metrics"]) == set(SILOS)
