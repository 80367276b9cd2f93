"""`silo join --nproc`: a count it cannot use is refused before anything starts, as one line
naming the count and what to do, with exit code 2. (GPU counts are checked only where a GPU is.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.cuda import needs_cuda
from tests.support.federation import Workspace, planted_hetero_graph
from trellis.silo.data.hetero import save_hetero_folder


@pytest.fixture(scope="module")
def ws(workspace_factory) -> Workspace:
    return workspace_factory("nproc", graphs=20)       # 16 training graphs per silo


def _join(ws: Workspace, *extra: str, data: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator", "127.0.0.1:1",
         "--data", str(data or ws.data("hospital-a")), "--identity",
         str(ws.identity("hospital-a")), "--state-dir", str(ws.root / "never"), *extra],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("count", ["0", "-2"])
def test_no_processes_is_refused(ws: Workspace, count: str) -> None:
    line = _one_error_line(_join(ws, "--nproc", count))
    assert line == f"error: --nproc {count}: expected 1 or more processes"


def test_more_processes_than_training_graphs_is_refused_with_the_count(ws: Workspace) -> None:
    line = _one_error_line(_join(ws, "--nproc", "17", "--device", "cpu"))
    assert "--nproc 17: " in line and "has 16 training graphs; each process needs at least " \
           "one (use --nproc 16 or fewer)" in line
    assert not (ws.root / "never").exists()          # nothing started, nothing written


def test_a_count_other_than_torchruns_is_refused(ws: Workspace) -> None:
    line = _one_error_line(_join(ws, "--nproc", "3", env={"RANK": "0", "WORLD_SIZE": "2",
                                                          "LOCAL_RANK": "0"}))
    assert line == ("error: --nproc 3, but this process is one of 2 (WORLD_SIZE, set by "
                    "torchrun): leave --nproc out under torchrun, or make them agree")


def test_fedhgn_data_is_refused_for_its_one_process_trainer(ws: Workspace, tmp_path: Path
                                                            ) -> None:
    hetero = tmp_path / "hetero"
    save_hetero_folder(planted_hetero_graph("item", (("shop", "sold_at", "sells"),), None, 30,
                                            seed=1), hetero)
    line = _one_error_line(_join(ws, "--nproc", "2", "--device", "cpu", data=hetero))
    assert "is a heterogeneous graph, and FedHGN's full-graph trainer runs in one process; " \
           "join without --nproc" in line


@needs_cuda("--nproc above the GPU count is refused naming the count")
def test_more_processes_than_gpus_is_refused(ws: Workspace) -> None:
    count = torch.cuda.device_count()
    line = _one_error_line(_join(ws, "--nproc", str(count + 1), "--device", "cuda"))
    assert f"this machine has {count} CUDA device(s), one per process; use --nproc {count} " \
           "or fewer, or --device cpu" in line
