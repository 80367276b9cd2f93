"""The public starting point's recipe (bench/pretrain_public.py), tiny: it writes an initial
model of the shared structure encoder that a plan can name by the SHA-256 it prints, and it
refuses a folder the federation's own data excludes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trellis.protos.plan import parse_plan
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder
from trellis.silo.training.initial_model import file_sha256, read_initial_model
from trellis.silo.training.trainers import make_trainer

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--hidden", "16", "--layers", "2", "--n-rw", "4", "--n-dg", "4"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "pretrain_public.py"), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("public")
    return [write_tu_folder(root, "PUBA", "social", 30, seed=1),
            write_tu_folder(root, "PUBB", "bio", 30, seed=2)]


def test_it_writes_an_initial_model_a_plan_names_by_the_printed_hash(public, tmp_path) -> None:
    out = tmp_path / "init.pt"
    done = _run("--data", *map(str, public), "--exclude", "NCI1", "--epochs", "1",
                "--out", str(out), *SMALL)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.split()[-1]
    assert printed == file_sha256(out)
    initial = read_initial_model(out)
    assert initial.header["groups"] == ["embedding_s", "graph_convs_s_gcn"]
    assert [s["name"] for s in initial.header["pretrained_on"]] == ["PUBA", "PUBB"]
    assert {n.split(".")[0] for n in initial.parameters} == {"embedding_s", "graph_convs_s_gcn"}
    # The same recipe gives the same file: the hash is reproducible.
    again = _run("--data", *map(str, public), "--epochs", "1", "--out",
                 str(tmp_path / "again.pt"), *SMALL)
    assert again.stdout.split()[-1] == printed
    # A silo of another dataset (other node features) starts its shared groups from it.
    silo = write_tu_folder(tmp_path, "MOL", "molecules", 40, seed=5)
    plan = parse_plan({"federation": {"id": "f", "algorithm": "fedstar", "rounds": 1,
                                      "silos": ["a", "b"]},
                       "model": {"hidden": 16, "layers": 2, "n_rw": 4, "n_dg": 4,
                                 "init_sha256": printed}}, base_dir=tmp_path).public
    trainer = make_trainer(load_tu_folder(silo), plan, "a", initial=initial)
    assert trainer.started_from == ("embedding_s", "graph_convs_s_gcn")


def test_an_excluded_dataset_is_refused(public, tmp_path) -> None:
    done = _run("--data", *map(str, public), "--exclude", "PUBB", "--out",
                str(tmp_path / "x.pt"), *SMALL)
    assert done.returncode == 1
    assert "PUBB is excluded (--exclude)" in done.stderr
    assert not (tmp_path / "x.pt").exists()
