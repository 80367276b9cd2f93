"""Reviewer reports of a real federation: `silo audit report` and `coordinator audit report`.

One two-round FedStar federation of three silo processes over mTLS, with an unadmitted
'intruder' that tries to join; the reports are written by the CLIs as processes and checked
against the logs themselves (digests, fingerprints, participants) and as HTML documents.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support.federation import (
    SILOS,
    Workspace,
    port_of,
    start_coordinator,
    start_silo,
    wait_all,
    write_plan,
)
from trellis.crypto.certificates import certificate_fingerprint

pytestmark = pytest.mark.slow
SILO = SILOS[0]


def cli(side: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"trellis.{side}.cli", "audit", "report",
                           *map(str, args)], capture_output=True, text=True, timeout=120)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def table_rows(markdown: str, first_cells: tuple[str, ...] = ()) -> list[list[str]]:
    """The cells of the Markdown table rows (all, or those whose first cells are given)."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if tuple(cells[:len(first_cells)]) == first_cells:
                rows.append(cells)
    return rows


def section(markdown: str, title: str) -> str:
    """The text of one `## title` section."""
    return markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def run(workspace_factory) -> tuple[Workspace, Path]:
    """A two-round FedStar federation of three silos that an intruder tries to join."""
    ws = workspace_factory("audit-reports", graphs=30)
    plan = write_plan(ws, "reports", rounds=2)
    folder = ws.root / "reports"
    folder.mkdir(exist_ok=True)
    coordinator = start_coordinator(plan, folder / "coordinator.log")
    intruder = subprocess.Popen(
        [sys.executable, "-m", "trellis.silo.cli", "join", "--coordinator",
         f"127.0.0.1:{port_of(plan)}", "--data", str(ws.data(SILO)), "--identity",
         str(ws.identity("intruder")), "--state-dir", str(folder / "intruder"), "--threads", "1",
         "--device", "cpu", "--connect-timeout", "60"],
        stdout=open(folder / "intruder.log", "w"), stderr=subprocess.STDOUT)
    assert wait_all([intruder], timeout=90) == [2], (folder / "intruder.log").read_text()
    silos = [start_silo(ws, s, port_of(plan), folder / s, folder / f"{s}.log") for s in SILOS]
    codes = wait_all([*silos, coordinator], timeout=180)
    logs = {p.name: p.read_text() for p in folder.glob("*.log")}
    assert codes == [0, 0, 0, 0], logs
    return ws, folder


@pytest.fixture(scope="module")
def silo_report(run, tmp_path_factory) -> str:
    ws, folder = run
    out = tmp_path_factory.mktemp("silo-report") / "report.md"
    done = cli("silo", "--state-dir", folder / SILO, "--identity", ws.identity(SILO),
               "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"wrote {out}: the audit log verifies" in done.stdout
    return out.read_text()


@pytest.fixture(scope="module")
def coordinator_report(run, tmp_path_factory) -> str:
    ws, folder = run
    out = tmp_path_factory.mktemp("coordinator-report") / "report.md"
    done = cli("coordinator", "--state-dir", folder / "coordinator", "--ca", ws.ca,
               "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out.read_text()


def test_silo_report_lists_each_upload_with_the_digest_the_coordinator_received(
        run, silo_report: str) -> None:
    _, folder = run
    receipts = [r for r in records(folder / "coordinator" / "audit.jsonl")
                if r["event"] == "received_tensor" and r["silo"] == SILO]
    assert [r["round"] for r in receipts] == [1, 2]
    for receipt in receipts:
        # attempt, what left, content, shape, dtype, bytes, protection, SHA-256, log line
        [row] = [row for row in table_rows(silo_report, (str(receipt["attempt"]), "masked input"))
                 if row[7] == receipt["sha256"]]
        assert row[3:6] == [" x ".join(map(str, receipt["shape"])), receipt["dtype"],
                            str(receipt["bytes"])]
        assert row[6].startswith("masked")
    sent = table_rows(silo_report)
    assert sum(row[1] == "masked input" for row in sent) == 2
    kinds = {row[1] for row in sent}
    assert {"key advert", "key shares", "survivor signature", "metrics"} <= kinds
    # Unmasking closes once every secret has t shares, so a silo whose reveal was not needed
    # sends none in a round: the report lists revealed shares exactly when the log has them.
    revealed = any(r["event"] == "revealed_shares" for r in records(folder / SILO / "audit.jsonl"))
    assert ("revealed shares" in kinds) == revealed
    assert "**OK: the log verifies:" in silo_report and "signatures valid" in silo_report
    assert "## Round 1" in silo_report and "## Round 2" in silo_report
    assert "global_state" in silo_report            # what it received


def test_silo_report_shows_the_accepted_plan_text_that_hashes_to_the_coordinators(
        run, silo_report: str) -> None:
    _, folder = run
    [serve] = [r for r in records(folder / "coordinator" / "audit.jsonl")
               if r["event"] == "serve"]
    assert f"- plan SHA-256: {serve['plan_sha256']}" in silo_report
    assert "**OK: the plan text below hashes to the recorded plan SHA-256**" in silo_report
    assert '"algorithm": "fedstar"' in silo_report


def test_a_tampered_silo_log_is_reported_as_failing_verification(run, tmp_path: Path) -> None:
    ws, folder = run
    state = tmp_path / "state"
    state.mkdir()
    for name in ("audit.jsonl", "audit.jsonl.head"):
        shutil.copy(folder / SILO / name, state / name)
    log = state / "audit.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if '"event":"sent_tensor"' in line)
    sent = json.loads(lines[index])
    lines[index] = lines[index].replace(sent["sha256"], "f" * 64)
    log.write_text("".join(lines))
    out = tmp_path / "report.md"
    done = cli("silo", "--state-dir", state, "--identity", ws.identity(SILO), "--out", out)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"error: wrote {out}, but the audit log does NOT verify: line {index + 2}: hash " \
           "chain broken" in done.stderr
    report = out.read_text()
    assert "**FAILED: verification FAILED:" in report
    assert f"- line {index + 2}: hash chain broken (line edited, removed or reordered" in report
    assert "OK: the log verifies" not in report


def test_coordinator_report_names_certificates_rounds_and_the_refused_intruder(
        run, coordinator_report: str) -> None:
    ws, folder = run
    for silo in SILOS:
        fingerprint = certificate_fingerprint((ws.identity(silo) / f"{silo}.crt").read_bytes())
        [row] = table_rows(coordinator_report, (silo, "yes"))
        assert row[2] == fingerprint
        assert row[5].startswith("serial ") and row[5].endswith(", valid")
    results = json.loads((folder / "coordinator" / "results.json").read_text())
    for entry in results["rounds"]:
        [row] = table_rows(section(coordinator_report, "Rounds"),
                           (str(entry["round"]), str(entry["attempts"])))
        assert row[2] == ", ".join(entry["participants"])
        assert row[3] == (", ".join(entry["dropped"]) or "none")
    assert "**OK: results.json agrees with the audit log on every round's participants" in (
        coordinator_report)
    [refusal] = [row for row in table_rows(coordinator_report) if row[1:2] == ["intruder"]]
    assert refusal[3] == "not admitted by the plan"
    assert "_the revocation list did not change while the coordinator ran_" in (
        coordinator_report)
    assert "**OK: the log verifies:" in coordinator_report
    assert "signatures valid" in coordinator_report


class _Structure(HTMLParser):
    """Checks that every element is closed in order; collects tags and attributes."""

    VOID = {"meta", "br", "hr", "img", "link", "input"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str | None]] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes += attrs
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"</{tag}> closes nothing open")


@pytest.mark.parametrize("side", ["silo", "coordinator"])
def test_html_reports_are_well_formed_and_self_contained(run, tmp_path: Path, side: str
                                                         ) -> None:
    ws, folder = run
    out = tmp_path / "report.html"
    state, trust = ((folder / SILO, ("--identity", ws.identity(SILO))) if side == "silo"
                    else (folder / "coordinator", ("--ca", ws.ca)))
    done = cli(side, "--state-dir", state, *trust, "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>")
    parser = _Structure()
    parser.feed(text)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    assert {"html", "head", "style", "body", "table"} <= parser.tags
    assert not parser.tags & {"script", "link", "img", "iframe", "object", "embed"}
    assert not [a for a in parser.attributes if a[0] in ("src", "href") or
                a[0].startswith("on")]
    assert not re.search(r"(https?:)?//[a-z0-9]", text.replace("<!DOCTYPE html>", ""),
                         re.IGNORECASE)
    assert "url(" not in text and "@import" not in text
    assert "OK: the log verifies" in text


def test_report_commands_refuse_bad_input_in_one_line(run, tmp_path: Path) -> None:
    _, folder = run
    odd = cli("silo", "--state-dir", folder / SILO, "--out", tmp_path / "report.txt")
    assert odd.returncode == 2
    assert odd.stderr.strip() == (f"error: --out {tmp_path / 'report.txt'}: cannot tell the "
                                  "format from .txt; name the file .md or .html, or pass "
                                  "--format md|html")
    missing = cli("coordinator", "--state-dir", tmp_path, "--out", tmp_path / "r.md")
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"error: no audit log {tmp_path / 'audit.jsonl'}")
    wrong = cli("silo", "--state-dir", folder / SILO, "--identity", tmp_path, "--out",
                tmp_path / "r.md")
    assert wrong.returncode == 2
    assert wrong.stderr.startswith(f"error: no {SILO}.crt in {tmp_path} (found none)")
    chosen = cli("silo", "--state-dir", folder / SILO, "--out", tmp_path / "r.txt",
                 "--format", "html")
    assert chosen.returncode == 0, chosen.stderr
    assert (tmp_path / "r.txt").read_text().startswith("<!DOCTYPE html>")
