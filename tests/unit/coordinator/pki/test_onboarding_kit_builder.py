"""The silo onboarding kit builder and `pki sign --kit`: contents, refusals, never a key."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from trellis.coordinator.cli.app import app
from trellis.coordinator.pki.onboarding import (
    KitError,
    build_kit,
    parse_address,
    tarball_path,
)
from trellis.crypto.certificates import holds_private_key
from trellis.crypto.pki import init_ca, request_identity, sign_request
from trellis.protos.plan import parse_plan

ADDRESS = "127.0.0.1:50051"


@pytest.fixture()
def signed(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA, a silo key made elsewhere, its signed certificate; (ca dir, csr, certificate)."""
    init_ca(tmp_path / "ca", ["coord.example.org", "127.0.0.1"])
    csr = request_identity("hospital-a", tmp_path / "silo-id")
    cert = sign_request(csr, tmp_path / "ca", out_dir=tmp_path / "signed")
    return tmp_path / "ca", csr, cert


def _plan(tmp_path: Path, algorithm: str = "fedstar", rounds: int = 7):
    """A parsed plan of three silos."""
    raw = {"federation": {"id": "kit-test", "algorithm": algorithm, "rounds": rounds,
                          "silos": ["hospital-a", "pharma-b", "lab-c"]}}
    return parse_plan(raw, base_dir=tmp_path)


def test_kit_has_every_file_filled_in_and_the_tarball_matches(
        tmp_path: Path, signed: tuple[Path, Path, Path]) -> None:
    ca, _, cert = signed
    kit = tmp_path / "kit"
    tarball = build_kit(kit, cert=cert, ca_cert=cert.parent / "ca.crt",
                        address=parse_address("coord.example.org:50051"))
    names = {p.name for p in kit.iterdir()}
    assert names == {"README.txt", "ca.crt", "hospital-a.crt", "coordinator.txt", "policy.toml",
                     "trellis-silo.service", "trellis-silo.env", "compose.yaml"}
    assert (kit / "hospital-a.crt").read_bytes() == cert.read_bytes()
    assert (kit / "ca.crt").read_bytes() == (ca / "ca.crt").read_bytes()
    assert (kit / "coordinator.txt").read_text() == "coord.example.org:50051\n"
    readme = (kit / "README.txt").read_text()
    # A standing silo first; every file the README lists is in the kit.
    assert "silo serve --coordinator coord.example.org:50051 --identity id/" in readme
    assert readme.index("silo serve") < readme.index("silo join")
    assert "cp kit/hospital-a.crt kit/ca.crt id/" in readme and "silo --version" in readme
    assert all(f"  {name} " in readme for name in names - {"README.txt"})
    unit = (kit / "trellis-silo.service").read_text()
    assert "Description=Trellis standing silo hospital-a" in unit and "Restart=always" in unit
    env = (kit / "trellis-silo.env").read_text()
    assert "TRELLIS_COORDINATOR_ADDRESS=coord.example.org:50051\n" in env
    compose = (kit / "compose.yaml").read_text()
    # A service of the silo image (deploy/docker/silo.Dockerfile: entrypoint `silo`, its
    # identity where the image expects it, read-only).
    service = yaml.safe_load(compose)["services"]["silo-hospital-a"]
    assert service["image"] == "trellis/silo:latest" and service["command"][0] == "serve"
    assert "coord.example.org:50051" in service["command"]
    assert "./id:/etc/trellis/identity:ro" in service["volumes"] and service["read_only"]
    assert tarball == tarball_path(kit) and tarball.name == "kit.tar.gz"
    with tarfile.open(tarball) as tar:
        packed = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore
    assert packed == {f"kit/{p.name}": p.read_bytes() for p in kit.iterdir()}


def test_no_file_of_the_kit_or_its_tarball_holds_key_material(
        tmp_path: Path, signed: tuple[Path, Path, Path]) -> None:
    _, _, cert = signed
    kit = tmp_path / "kit"
    tarball = build_kit(kit, cert=cert, ca_cert=cert.parent / "ca.crt",
                        address=parse_address(ADDRESS), plan=_plan(tmp_path).public)
    with tarfile.open(tarball) as tar:
        packed = [tar.extractfile(m).read() for m in tar.getmembers()]  # type: ignore
    files = [p.read_bytes() for p in kit.iterdir()]
    assert len(files) == len(packed) == 8
    for data in [*files, *packed, tarball.read_bytes()]:
        assert b"PRIVATE KEY" not in data
        assert not holds_private_key(data)


def test_a_certificate_file_carrying_a_key_is_refused_and_nothing_written(
        tmp_path: Path, signed: tuple[Path, Path, Path]) -> None:
    _, csr, cert = signed
    bundle = tmp_path / "bundle.crt"     # an operator's "certificate and key in one file"
    bundle.write_bytes(cert.read_bytes() + csr.with_suffix(".key").read_bytes())
    kit = tmp_path / "kit"
    with pytest.raises(KitError, match="private key"):
        build_kit(kit, cert=bundle, ca_cert=cert.parent / "ca.crt",
                  address=parse_address(ADDRESS))
    assert not kit.exists() and not tarball_path(kit).exists()


def test_holds_private_key_knows_every_encoding() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    locked = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                               serialization.BestAvailableEncryption(b"secret"))
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    assert holds_private_key(pem) and holds_private_key(der) and holds_private_key(locked)
    assert not holds_private_key(public) and not holds_private_key(b"coord.example.org:1\n")


@pytest.mark.parametrize("address", ["coord.example.org", "coord.example.org:", ":50051",
                                     "0.0.0.0:50051", "coord.example.org:99999"])
def test_address_without_a_dialable_host_and_port_is_refused(address: str) -> None:
    with pytest.raises(KitError, match="--coordinator-address"):
        parse_address(address)


def test_sign_with_kit_and_its_one_line_errors(tmp_path: Path,
                                               signed: tuple[Path, Path, Path]) -> None:
    ca, csr, _ = signed
    plan = tmp_path / "plan.toml"
    plan.write_text('[federation]\nid = "x"\nalgorithm = "fedstar"\nrounds = 3\n'
                    'silos = ["pharma-b", "lab-c"]\n')
    runner = CliRunner()

    def sign(*extra: str) -> tuple[int, str]:
        result = runner.invoke(app, ["pki", "sign", str(csr), "--ca", str(ca),
                                     "--out", str(tmp_path / "out"), *extra])
        return result.exit_code, result.output

    kit = str(tmp_path / "kit")
    for extra, text in [
        (["--kit", kit, "--coordinator-address", "coord.example.org"], "expected host:port"),
        (["--kit", kit], "--kit needs --coordinator-address"),
        (["--kit", kit, "--coordinator-address", "elsewhere.org:1"], "names only"),
        (["--kit", kit, "--coordinator-address", ADDRESS, "--plan", str(tmp_path / "no.toml")],
         "cannot read plan file"),
        (["--coordinator-address", ADDRESS], "go with --kit"),
    ]:
        code, output = sign(*extra)
        assert code == 2, output
        assert output.count("error:") == 1 and text in output, output
    assert not (tmp_path / "out").exists()          # nothing is signed on bad input
    # The fixture signed hospital-a already: a second certificate is only issued as a renewal.
    code, output = sign("--kit", kit, "--coordinator-address", ADDRESS, "--plan", str(plan))
    assert code == 2 and "'hospital-a' already holds a valid certificate" in output, output
    assert not (tmp_path / "out").exists() and not (tmp_path / "kit").exists()
    code, output = sign("--kit", kit, "--coordinator-address", ADDRESS, "--plan", str(plan),
                        "--renew")
    assert code == 0, output
    assert "note: hospital-a is not in federation.silos" in output
    assert (tmp_path / "kit" / "hospital-a.crt").exists() and (tmp_path / "kit.tar.gz").exists()
    assert "# max_rounds = 3" in (tmp_path / "kit" / "policy.toml").read_text()
    (tmp_path / "kit.tar.gz").unlink()
    code, output = sign("--kit", kit, "--coordinator-address", ADDRESS)
    assert code == 2 and "not an empty folder" in output, output
