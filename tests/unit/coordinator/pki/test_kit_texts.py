"""The onboarding kit's texts set a silo up as a standing silo: its systemd unit and
environment file are deploy/systemd's filled in, its compose service runs `silo serve` as
deploy/compose's silos do, and every command the README, the unit and the service give is
one this version's `silo` parses and lists in its --help."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.paths import ROOT
from tests.support.commands import check_command, commands_in_text
from tests.support.systemd import environment_file, exec_start, unit_sections
from trellis.coordinator.pki.kit_texts import ENV_FILE, UNIT_FILE
from trellis.coordinator.pki.onboarding import kit_files, parse_address
from trellis.protos.plan import parse_plan

ADDRESS = "coord.example.org:50051"
SYSTEMD = ROOT / "deploy" / "systemd"


def _kit(dataset: str = "chem") -> dict[str, str]:
    """The text files of hospital-a's kit, made for a job plan of that dataset."""
    raw = {"federation": {"id": "chem-study", "algorithm": "fedstar", "rounds": 3,
                          "dataset": dataset, "silos": ["hospital-a", "pharma-b"]}}
    plan = parse_plan(raw, base_dir=Path(".")).public
    files = kit_files("hospital-a", parse_address(ADDRESS), cert_pem=b"", ca_pem=b"",
                      plan=plan, folder="hospital-a-kit")
    return {name: data.decode() for name, data in files.items() if not name.endswith(".crt")}


def test_the_unit_is_deploys_standing_silo_unit_with_the_silos_name() -> None:
    kit = unit_sections(_kit()[UNIT_FILE])
    deploy = unit_sections((SYSTEMD / UNIT_FILE).read_text())
    assert kit.sections() == deploy.sections()
    assert kit["Unit"]["Description"] == "Trellis standing silo hospital-a (silo serve)"
    for section in deploy.sections():
        mine = {k: v for k, v in kit[section].items() if k != "Description"}
        theirs = {k: v for k, v in deploy[section].items() if k != "Description"}
        assert mine == theirs, section
    assert "deploy/systemd/trellis-silo.service" in _kit()[UNIT_FILE]


def test_the_environment_file_is_deploys_with_the_address_and_dataset_filled_in() -> None:
    kit = environment_file(_kit()[ENV_FILE])
    deploy = environment_file((SYSTEMD / ENV_FILE).read_text())
    assert kit.keys() == deploy.keys()
    assert kit["TRELLIS_COORDINATOR_ADDRESS"] == ADDRESS
    assert kit["TRELLIS_DATA"] == "--data chem=/srv/trellis/silo/graphs"
    assert kit["TRELLIS_SILO_OPTIONS"] == deploy["TRELLIS_SILO_OPTIONS"]


def test_the_units_command_is_a_valid_silo_serve_writing_only_its_state_root() -> None:
    texts = _kit()
    unit = unit_sections(texts[UNIT_FILE])
    argv = exec_start(unit, environment_file(texts[ENV_FILE]))
    assert argv[1] == "serve"
    params = check_command(argv)
    assert params["coordinator"] == ADDRESS and params["data"] == ["chem=/srv/trellis/silo/graphs"]
    assert unit["Service"]["ReadWritePaths"] == str(params["state_root"])
    assert unit["Service"]["EnvironmentFile"] == "/etc/trellis/silo.env"
    assert "/etc/trellis/silo.env" in texts["README.txt"]


def test_every_command_of_the_readme_is_valid_and_serve_comes_first() -> None:
    commands = [c for c in commands_in_text(_kit()["README.txt"]) if c[1:] != ["--version"]]
    for argv in commands:
        check_command(argv)
    subcommands = [tuple(w for w in argv[1:3] if not w.startswith("-")) for argv in commands]
    assert subcommands[0] == ("serve",)
    assert {("jobs", "list"), ("jobs", "show"), ("jobs", "approve"), ("jobs", "refuse"),
            ("join",)} <= set(subcommands)
    serve = check_command(commands[0])
    assert serve["coordinator"] == ADDRESS and serve["data"] == ["chem=graphs/"]
    assert str(serve["policy_file"]) == "policy.toml" and str(serve["state_root"]) == "state"
    [join] = [argv for argv in commands if argv[1] == "join"]
    assert check_command(join)["coordinator"] == ADDRESS


@pytest.mark.parametrize("dataset", ["chem", ""])
def test_the_compose_service_runs_silo_serve_as_deploys_compose_silos_do(dataset: str) -> None:
    service = yaml.safe_load(_kit(dataset)["compose.yaml"])["services"]["silo-hospital-a"]
    deploy = yaml.safe_load((ROOT / "deploy" / "compose" / "compose.yaml").read_text())
    silo = deploy["services"]["hospital-a"]
    params = check_command(["silo", *service["command"]])
    assert service["command"][0] == "serve" == silo["command"][0]
    assert params["coordinator"] == ADDRESS
    assert params["data"] == [f"{dataset or 'graphs'}=/data"]
    theirs = check_command(["silo", *silo["command"]])
    for option in ("identity", "policy_file", "state_root"):
        assert params[option] == theirs[option], option
    for key in ("restart", "read_only", "cap_drop", "security_opt", "tmpfs"):
        assert service[key] == silo[key], key
    mounts = {volume.split(":")[1] for volume in service["volumes"]}
    assert mounts == {volume.split(":")[1] for volume in silo["volumes"]}
