"""`silo data prepare|inspect|fingerprint` (silo/cli/data_prep.py): what the operator reads,
one line and exit 2 for every mistake, and nothing half-written when a preparation fails or is
stopped (by Ctrl-C, or by SIGTERM in a real process)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.paths import ROOT
from tests.support.prepared_sources import STARTED_ENV
from trellis.silo.cli.app import app
from trellis.silo.cli.exits import EXIT_BAD_INPUT
from trellis.silo.data.datasets import load_graph_folder
from trellis.silo.data.prepared.folder import read_manifest
from trellis.silo.data.prepared.registry import READERS
from trellis.silo.data.synthetic import write_tu_folder
from trellis.silo.data.tu import load_tu_folder

SOURCES = "tests.support.prepared_sources"


@pytest.fixture(autouse=True)
def _sigterm_restored() -> Iterator[None]:
    """`prepare` turns SIGTERM into an interrupt, as a command should; not for pytest after."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _silo(*args: object) -> Result:
    return CliRunner().invoke(app, ["data", *map(str, args)])


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_tu_folder_is_prepared_inspected_and_read_by_join(tmp_path: Path) -> None:
    folder = write_tu_folder(tmp_path / "demo", "MOL", "molecules", 30, seed=4)
    done = _silo("prepare", tmp_path / "demo", "--out", tmp_path / "prepared")
    assert done.exit_code == 0, done.stderr
    labels = read_manifest(tmp_path / "prepared")["counts"]["classes"]
    per_class = ", ".join(f"label {k}: {v}" for k, v in labels.items())
    assert done.stdout == (f"wrote 30 graphs ({per_class}) to {tmp_path / 'prepared'}; 0 row(s) "
                           "refused\n")
    assert done.stderr == ""
    assert len(load_graph_folder(tmp_path / "prepared").graphs) == len(
        load_tu_folder(folder).graphs)
    shown = _silo("inspect", tmp_path / "prepared")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.startswith(f"MOL: {tmp_path / 'prepared'}\n")
    assert "  graphs:        30\n" in shown.stdout
    assert "(stratified 80/10/10, as training makes it)" in shown.stdout
    as_json = _silo("inspect", tmp_path / "prepared", "--json")
    assert json.loads(as_json.stdout)["graphs"] == 30


def test_an_output_folder_with_something_in_it_is_refused(tmp_path: Path) -> None:
    write_tu_folder(tmp_path / "demo", "MOL", "molecules", 10, seed=4)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine\n")
    done = _silo("prepare", tmp_path / "demo", "--out", tmp_path / "out")
    assert done.exit_code == EXIT_BAD_INPUT
    assert done.stderr == (f"error: {tmp_path / 'out'}: already exists and is not an empty "
                           "folder; name a new output folder (nothing was written)\n")
    assert _left(tmp_path / "out") == ["keep.txt"]


def test_a_bad_source_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    folder = write_tu_folder(tmp_path / "demo", "MOL", "molecules", 10, seed=4)
    adjacency = folder / "MOL_A.txt"
    lines = adjacency.read_text().splitlines()
    lines[2] = "3, x"
    adjacency.write_text("\n".join(lines) + "\n")
    done = _silo("prepare", tmp_path / "demo", "--out", tmp_path / "out")
    assert done.exit_code == EXIT_BAD_INPUT
    assert done.stderr == ("error: MOL_A.txt line 3: expected two comma-separated node ids, "
                           "got '3, x'\n")
    assert _left(tmp_path) == ["demo"]


@pytest.mark.parametrize(("args", "line"), [
    (["missing.csv"], "{tmp}/missing.csv: no such file or folder"),
    (["notes.docx"], "{tmp}/notes.docx: cannot tell the format from its name; name it with "
                     "--format"),
    (["notes.docx", "--format", "excel"], "--format 'excel': valid choices: tu, smiles, sdf"),
])
def test_a_source_that_cannot_be_read_is_one_line(tmp_path: Path, args: list[str], line: str
                                                  ) -> None:
    (tmp_path / "notes.docx").write_text("x\n")
    done = _silo("prepare", tmp_path / args[0], *args[1:], "--out", tmp_path / "out")
    assert done.exit_code == EXIT_BAD_INPUT
    assert done.stderr.startswith("error: " + line.format(tmp=tmp_path))
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_format_of_a_later_version_is_one_line(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(READERS, "later", "trellis.silo.data.not_yet.later:read")
    (tmp_path / "g.txt").write_text("x\n")
    done = _silo("prepare", tmp_path / "g.txt", "--format", "later", "--out", tmp_path / "out")
    assert (done.exit_code, done.stderr) == (
        EXIT_BAD_INPUT, "error: format later is not available in this version\n")


def test_refused_rows_are_listed_kept_in_the_manifest_or_stop_with_strict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(READERS, "refusing", f"{SOURCES}:read_refusing")
    source = tmp_path / "rows.txt"
    source.write_text("rows\n")
    strict = _silo("prepare", source, "--format", "refusing", "--out", tmp_path / "strict",
                   "--strict")
    assert strict.exit_code == EXIT_BAD_INPUT
    lines = strict.stderr.splitlines()
    assert lines[0] == "warning: rows.txt: row 13: row 13 has no label"
    assert lines[20:] == ["warning: ... and 5 more",
                          "error: rows.txt: row 13: row 13 has no label (25 row(s) refused and "
                          "--strict is set: nothing written)"]
    assert _left(tmp_path) == ["rows.txt"]
    kept = _silo("prepare", source, "--format", "refusing", "--out", tmp_path / "kept")
    assert kept.exit_code == 0, kept.stderr
    assert kept.stderr.splitlines()[20:] == ["warning: ... and 5 more, all in manifest.json"]
    assert kept.stdout.endswith("; 25 row(s) refused\n")
    assert len(read_manifest(tmp_path / "kept")["refused"]) == 25


def test_a_preparation_interrupted_while_writing_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(READERS, "interrupted", f"{SOURCES}:read_interrupted")
    (tmp_path / "rows.txt").write_text("rows\n")
    done = _silo("prepare", tmp_path / "rows.txt", "--format", "interrupted", "--out",
                 tmp_path / "out")
    assert done.exit_code == 130
    assert done.stderr == f"error: interrupted: nothing written to {tmp_path / 'out'}\n"
    assert _left(tmp_path) == ["rows.txt"]


def test_a_preparation_stopped_by_sigterm_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "rows.txt").write_text("rows\n")
    started = tmp_path.parent / f"{tmp_path.name}-started"
    script = (f"import sys; from trellis.silo.data.prepared.registry import READERS; "
              f"READERS['stalled'] = '{SOURCES}:read_stalled'; "
              "from trellis.silo.cli.app import main; sys.argv[1:] = ['data', 'prepare', "
              f"{str(tmp_path / 'rows.txt')!r}, '--format', 'stalled', '--out', "
              f"{str(tmp_path / 'out')!r}]; main()")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                               env={**os.environ, STARTED_ENV: str(started)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), process.communicate()[1]
        # Half-way: the folder being written exists, hidden, beside the output.
        assert [n for n in _left(tmp_path) if n.startswith(".out.partial-")]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert stderr == f"error: stopped (SIGTERM): nothing written to {tmp_path / 'out'}\n"
    assert _left(tmp_path) == ["rows.txt"]


def test_inspect_refuses_a_dataset_too_small_for_the_split(tmp_path: Path) -> None:
    write_tu_folder(tmp_path / "demo", "MOL", "molecules", 4, seed=4)
    assert _silo("prepare", tmp_path / "demo", "--out", tmp_path / "out").exit_code == 0
    shown = _silo("inspect", tmp_path / "out")
    assert shown.exit_code == EXIT_BAD_INPUT
    assert "  graphs:        4\n" in shown.stdout
    assert shown.stderr.startswith(f"error: {tmp_path / 'out'}: 4 graphs (class 0: ")
    assert "a silo needs at least 6 graphs" in shown.stderr
    assert shown.stderr.count("\n") == 1


def test_inspect_refuses_what_is_not_a_prepared_folder(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    shown = _silo("inspect", tmp_path / "out")
    assert (shown.exit_code, shown.stdout) == (EXIT_BAD_INPUT, "")
    assert shown.stderr == (f"error: {tmp_path / 'out' / 'manifest.json'}: missing; is "
                            f"{tmp_path / 'out'} a prepared folder?\n")


def _fingerprint_module_present() -> bool:
    try:
        return importlib.util.find_spec("trellis.silo.data.molecules.fingerprint") is not None
    except ModuleNotFoundError:
        return False


def test_fingerprint_prints_the_reference_hash_or_says_it_is_not_available() -> None:
    done = _silo("fingerprint", "--json")
    if not _fingerprint_module_present():
        assert done.exit_code == EXIT_BAD_INPUT
        assert done.stderr.endswith(" is not available in this version\n")
        assert done.stderr.count("\n") == 1
        return
    pytest.importorskip("rdkit")
    assert done.exit_code == 0, done.stderr
    digest = json.loads(done.stdout)["fingerprint"]
    assert len(digest) == 64 and int(digest, 16) >= 0
    standardised = _silo("fingerprint", "--standardise")
    assert standardised.exit_code == 0 and digest not in standardised.stdout
