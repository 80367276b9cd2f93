"""The test suite's view of this machine's processes (tests/support/processes.py), over a
made-up /proc: a Ray installed under a checkout at a long path is still recognised."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import processes, ray_processes, raylets

# A checkout at a long path, with Ray installed in its own .venv.
CHECKOUT = "/home/someone/" + "a-very-long-checkout-path-" * 6 + "/trellis"
RAY = f"{CHECKOUT}/.venv/lib/python3.11/site-packages/ray"
RAY_FOLDER = "/tmp/trellis-rt-abc123/trellis-ray-def456"


def _process(proc: Path, pid: int, argv: list[str], environ: dict[str, str]) -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (folder / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0"
                                              for k, v in environ.items()))


def _fake_proc(root: Path) -> Path:
    proc = root / "proc"
    _process(proc, 101, [f"{RAY}/core/src/ray/gcs/gcs_server",
                         f"--log_dir={RAY_FOLDER}/session_1/logs"], {})
    _process(proc, 102, [f"{RAY}/core/src/ray/raylet/raylet",
                         f"--raylet_socket_name={RAY_FOLDER}/session_1/sockets/raylet",
                         "--node_manager_port=0"], {})
    # A worker renamed itself; only its environment says whose it is.
    _process(proc, 103, ["ray::SiloHost"], {"RAY_RAYLET_PID": "102", "HOME": "/home/someone"})
    # Somebody else's raylet and process: left out.
    _process(proc, 201, [f"{RAY}/core/src/ray/raylet/raylet",
                         "--raylet_socket_name=/tmp/other/session_9/sockets/raylet"], {})
    _process(proc, 202, ["ray::Other"], {"RAY_RAYLET_PID": "201"})
    _process(proc, 203, ["/usr/bin/sleep", "300"], {})
    (proc / "self").mkdir()          # not a process id
    return proc


def test_a_raylet_under_a_long_path_is_recognised_by_its_whole_command_line(tmp_path) -> None:
    proc = _fake_proc(tmp_path)
    assert len(f"{RAY}/core/src/ray/raylet/raylet") > 150
    assert raylets(RAY_FOLDER, proc) == {102}


def test_the_runs_processes_are_those_naming_its_folder_or_its_raylet(tmp_path) -> None:
    proc = _fake_proc(tmp_path)
    found = ray_processes(RAY_FOLDER, {102}, proc)
    assert sorted(p.pid for p in found) == [101, 102, 103]
    # Whole command lines, however long.
    assert {p.pid: p.command for p in found}[102].endswith("--node_manager_port=0")


def test_a_process_ending_while_read_is_left_out(tmp_path) -> None:
    proc = _fake_proc(tmp_path)
    (proc / "203" / "environ").unlink()       # as if it ended between the two reads
    assert 203 not in {p.pid for p in processes(proc)}
