"""Which of a silo's processes this one is (silo/training/launch.py), from --nproc and torchrun's
variables."""

from __future__ import annotations

import pytest

from trellis.silo.training.launch import SPAWNED_BY, Launch, launch_of

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500"}


def test_without_a_launcher_nproc_decides_and_this_process_is_rank_0() -> None:
    assert launch_of(None, {}) == Launch(0, 1, 0)
    assert launch_of(3, {}) == Launch(0, 3, 0)
    assert not launch_of(1, {}).parallel and launch_of(2, {}).parallel


def test_torchrun_variables_make_this_process_one_of_its_group() -> None:
    assert launch_of(None, TORCHRUN) == Launch(1, 2, 1, spawned=False, torchrun=True)
    assert launch_of(2, TORCHRUN) == Launch(1, 2, 1, spawned=False, torchrun=True)
    spawned = {**TORCHRUN, SPAWNED_BY: "4242"}
    assert launch_of(None, spawned) == Launch(1, 2, 1, spawned=True, torchrun=False)


@pytest.mark.parametrize(("nproc", "environ", "message"), [
    (0, {}, "--nproc 0: expected 1 or more processes"),
    (-1, TORCHRUN, "--nproc -1: expected 1 or more processes"),
    (3, TORCHRUN, "--nproc 3, but this process is one of 2 (WORLD_SIZE, set by torchrun)"),
    (None, {**TORCHRUN, "RANK": "two"}, "RANK='two', WORLD_SIZE='2': expected whole numbers"),
    (None, {**TORCHRUN, "RANK": "2"}, "RANK=2, WORLD_SIZE=2, LOCAL_RANK=1: expected 0 <= RANK "
                                      "< WORLD_SIZE"),
    (None, {**TORCHRUN, "MASTER_PORT": "0"}, "MASTER_PORT=0: the processes could not meet"),
])
def test_a_count_or_launch_that_cannot_work_is_one_clear_error(nproc: int | None,
                                                               environ: dict, message: str
                                                               ) -> None:
    with pytest.raises(ValueError) as info:
        launch_of(nproc, environ)
    assert str(info.value).startswith(message), info.value
