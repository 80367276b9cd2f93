"""The silo operator's view of a real federation: its metrics file, `silo status`, `silo predict`.

One FedStar federation of three silo processes over mTLS on loopback; hospital-a runs with
`--report none`. The first coordinator is killed in round 2 (an exact failpoint), so `silo
status` is seen mid-run, with the silo alive and waiting; a second coordinator resumes the run,
which makes every silo send round 1's figures again (they must not be written twice).
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.federation import (
    SILOS,
    Workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.protos.plan import PublicPlan
from trellis.silo.data.datasets import load_graph_folder, locate_tu_folder
from trellis.silo.data.split import stratified_split
from trellis.silo.data.tu import read_tu_structure
from trellis.silo.data.tu_split import write_tu_subsets
from trellis.silo.operations.metrics_file import read_metrics
from trellis.silo.training.model_file import read_metadata
from trellis.silo.training.trainer import LocalTrainer

pytestmark = pytest.mark.slow
SILENT = SILOS[0]           # reports nothing to the coordinator
ROUNDS = 3


def silo_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trellis.silo.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def run(workspace_factory) -> tuple[Workspace, Path, dict]:
    """The federation's folder, and `silo status --json` of the silent silo taken mid-run."""
    ws = workspace_factory("silo-view", graphs=40)
    plan = write_plan(ws, "view", rounds=ROUNDS)
    folder = ws.root / "view"
    folder.mkdir(exist_ok=True)
    first = start_coordinator(plan, folder / "coordinator-1.log",
                              env={"TRELLIS_COORDINATOR_FAILPOINT": "stage_closed/input:2"})
    silos = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log",
                        extra=("--report", "none") if s == SILENT else ())
             for s in SILOS]
    try:
        assert first.wait(timeout=240) == -signal.SIGKILL, (
            folder / "coordinator-1.log").read_text()[-3000:]
        mid = silo_cli("status", "--state-dir", folder / SILENT, "--json")
    finally:
        if first.poll() is None:
            for process in (first, *silos):
                process.kill()
    assert mid.returncode == 0, mid.stderr
    second = start_coordinator(plan, folder / "coordinator-2.log")
    codes = wait_all([*silos, second], timeout=300)
    logs = {p.name: p.read_text()[-3000:] for p in folder.glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    return ws, folder, json.loads(mid.stdout)


def test_metrics_file_has_every_round_once_though_nothing_was_reported(run) -> None:
    _, folder, _ = run
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    # The coordinator got nothing from the silent silo, in any round.
    assert all(not r["metrics"].get(SILENT) for r in results["rounds"]), results["rounds"]
    records = read_metrics(folder / SILENT / "metrics.jsonl")
    # Round 1's figures were sent again after the coordinator restart: written once.
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    for record in records:
        assert {"val_acc", "val_loss", "test_acc", "test_loss", "train_loss", "time",
                "train_seconds"} <= set(record), record
        assert 0.0 <= record["test_acc"] <= 1.0 and record["train_seconds"] > 0
    # A reporting silo's file holds what it reported to the coordinator for the last round.
    other = SILOS[1]
    last = read_metrics(folder / other / "metrics.jsonl")[-1]
    assert last["test_acc"] == results["final_metrics"][other]["test_acc"]


def test_status_mid_run_shows_rounds_done_and_an_open_log(run) -> None:
    _, folder, mid = run
    assert mid["status"] == "running" and mid["final_model"] is None
    assert (mid["federation"], mid["algorithm"], mid["rounds_total"]) == ("view", "fedstar",
                                                                          ROUNDS)
    assert mid["rounds_done"] == 1 and mid["last_round"]["round"] == 1
    assert mid["audit"]["ok"] and mid["audit"]["open"]
    # Round 1's masked input was sent (round 2's too, before the coordinator died in it).
    assert mid["sent"]["by_kind"]["masked inputs"][0] in (1, 2)
    assert mid["sent"]["metrics_reports"] == 1 and mid["sent"]["metric_names"] == []


def test_status_after_the_end_with_signatures(run) -> None:
    ws, folder, _ = run
    done = silo_cli("status", "--state-dir", folder / SILENT, "--identity",
                    ws.identity(SILENT), "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["status"] == "finished" and found["rounds_done"] == ROUNDS
    assert found["audit"] == {"ok": True, "open": False, "records": found["audit"]["records"],
                              "signatures_checked": True, "problems": []}
    audit = [json.loads(line) for line in (folder / SILENT / "audit.jsonl").read_text()
             .splitlines()]
    masked = [r for r in audit if r["event"] == "sent_tensor"]
    assert found["sent"]["by_kind"]["masked inputs"] == [len(masked),
                                                         sum(r["bytes"] for r in masked)]
    label = found["final_model"]["label"]
    assert label["round"] == ROUNDS and label["metrics"]["test_acc"] == found["last_round"][
        "test_acc"]
    text = silo_cli("status", "--state-dir", folder / SILENT, "--identity", ws.identity(SILENT))
    assert text.returncode == 0, text.stderr
    assert f"federation view (fedstar): {ROUNDS} of {ROUNDS} rounds done" in text.stdout
    assert "signatures verified" in text.stdout and "final model" in text.stdout


def test_status_refuses_a_folder_that_is_no_silos(tmp_path: Path) -> None:
    done = silo_cli("status", "--state-dir", tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"error: --state-dir {tmp_path}: no audit.jsonl; is this the "
                                   "folder `silo join --state-dir` wrote?")


def _test_split_folder(ws: Workspace, out: Path) -> tuple[Path, np.ndarray]:
    """The silo's test graphs as a TU folder of their own, as the plan's split draws them."""
    source = locate_tu_folder(ws.data(SILENT))
    labels = read_tu_structure(source).graph_labels
    test = stratified_split(labels, seed=123).test
    return write_tu_subsets(source, [test], out)[0], np.sort(test)


def test_predict_on_the_test_split_reproduces_the_silos_own_test_accuracy(run, tmp_path: Path
                                                                          ) -> None:
    ws, folder, _ = run
    model = folder / SILENT / "final_model.pt"
    label = read_metadata(model)
    plan = PublicPlan.from_json(label["plan"])
    assert plan.training.split_seed == 123
    subset, test = _test_split_folder(ws, tmp_path / "test-graphs")
    out = tmp_path / "predictions.csv"
    done = silo_cli("predict", "--model", model, "--data", subset, "--out", out)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(test) and [int(r["graph"]) for r in rows] == list(
        range(1, len(test) + 1))
    correct = sum(r["label"] == r["predicted"] for r in rows)
    assert correct / len(rows) == label["metrics"]["test_acc"]
    assert f"accuracy {correct / len(rows):.4f}" in done.stdout
    for row in rows:
        probabilities = [float(v) for k, v in row.items() if k.startswith("prob_")]
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-4)
    # The same predictions as the trainer's own evaluation on those graphs, graph by graph.
    trainer = LocalTrainer(load_graph_folder(ws.data(SILENT)), plan, SILENT)
    trainer.restore(torch.load(model, weights_only=True))
    assert np.array_equal(np.sort(trainer.split.test), test)
    assert trainer.evaluate("test")[0] == label["metrics"]["test_acc"]
    order = np.argsort(trainer.split.test)          # the subset holds them in file order
    assert trainer.encoding is not None
    own = [str(trainer.encoding.classes[c]) for c in trainer.predictions("test")[order]]
    assert [r["predicted"] for r in rows] == own


def test_predict_refuses_bad_inputs_with_one_line(run, tmp_path: Path) -> None:
    ws, folder, _ = run
    model = folder / SILENT / "final_model.pt"
    out = tmp_path / "p.csv"
    # Not a final model: the resume state.
    done = silo_cli("predict", "--model", folder / SILENT / "resume.pt", "--data",
                    ws.data(SILENT), "--out", out)
    assert done.returncode == 2 and "is not a Trellis final model" in done.stderr
    assert done.stderr.count("\n") == 1 and not out.exists()
    # Another silo's data: its node labels are outside what this model was trained on.
    other = ws.data(SILOS[2])
    done = silo_cli("predict", "--model", model, "--data", other, "--out", out)
    assert done.returncode == 2 and done.stderr.startswith(f"error: --data {other}: ")
    assert done.stderr.count("\n") == 1 and not out.exists()
    # A graph label the model does not know.
    subset, _ = _test_split_folder(ws, tmp_path / "relabelled")
    labels = next(subset.glob("*_graph_labels.txt"))
    labels.write_text("7\n" + "".join(labels.read_text().splitlines(True)[1:]))
    done = silo_cli("predict", "--model", model, "--data", subset, "--out", out)
    assert done.returncode == 2 and "graph label 7 is not one of the model's classes" in (
        done.stderr), done.stderr
    # An older final model, without what rebuilds its model.
    saved = torch.load(model, weights_only=True)
    for key in ("model", "plan"):
        del saved["metadata"][key]
    old = tmp_path / "old.pt"
    torch.save(saved, old)
    done = silo_cli("predict", "--model", old, "--data", subset, "--out", out)
    assert done.returncode == 2 and "saved by an older Trellis" in done.stderr
