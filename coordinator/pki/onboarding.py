"""Silo onboarding kits: what a new silo's operator gets back with its certificate.

`coordinator pki sign SILO.csr --kit DIR --coordinator-address HOST:PORT` writes DIR (and
DIR.tar.gz beside it) with the CA certificate, the silo's signed certificate, the address to
dial, a README with the exact commands, a policy template and service snippets. A kit never
holds a private key: every file is checked before anything is written, and the builder refuses
one that is or holds a key (the silo's key never leaves its machine; the CA's and the server's
must never leave this one).

Over 400 lines because about half of it is the text of the kit's files (README, policy
template, systemd unit, compose service), filled from the same file names, address and plan
that the builder checks and writes.
"""

from __future__ import annotations

import io
import ipaddress
import tarfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

from trellis.crypto.certificates import (
    certificate_hosts,
    certificate_subject,
    holds_private_key,
    verify_certificate,
)
from trellis.crypto.errors import PkiError
from trellis.crypto.pki import CA_CERT
from trellis.protos.algorithms import algorithm
from trellis.protos.files import write_atomic
from trellis.protos.plan import PublicPlan
from trellis.protos.version import package_version

ADDRESS_FILE = "coordinator.txt"
POLICY_FILE = "policy.toml"
README_FILE = "README.txt"
COMPOSE_FILE = "compose.yaml"
_WILDCARD_HOSTS = {"0.0.0.0", "::", "*", ""}


class KitError(ValueError):
    """The kit cannot be made as asked (bad address, folder in use, a key among the files)."""


@dataclass(frozen=True)
class Address:
    """Where silos dial the coordinator: a host the server certificate names, and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    """Parse host:port (an IPv6 host in brackets); refuse a missing port or a wildcard host."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise KitError(f"--coordinator-address {text!r}: expected host:port, e.g. "
                       "coord.example.org:50051")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host in _WILDCARD_HOSTS:
        raise KitError(f"--coordinator-address {text!r}: {host or 'an empty host'} is where the "
                       "coordinator listens, not an address silos can dial; give the name or IP "
                       "in its server certificate (pki init --host)")
    return Address(host, int(port))


def check_address_in_certificate(address: Address, server_cert_pem: bytes) -> None:
    """Refuse an address whose host the coordinator's certificate does not name (TLS would)."""
    hosts = certificate_hosts(server_cert_pem)
    wanted = address.host.lower()
    try:
        wanted = str(ipaddress.ip_address(wanted))
    except ValueError:
        pass
    if wanted not in {h.lower() for h in hosts}:
        raise KitError(f"--coordinator-address {address}: the server certificate names only "
                       f"{', '.join(hosts) or 'no host'}, so silos could not verify the "
                       f"coordinator at {address.host}; use one of those or re-run pki init "
                       "with --host")


def check_empty_folder(kit_dir: Path) -> Path:
    """Refuse a kit folder that holds anything, or a path that is a file; return the tarball."""
    if kit_dir.exists() and (not kit_dir.is_dir() or any(kit_dir.iterdir())):
        raise KitError(f"--kit {kit_dir}: not an empty folder; give a new or empty one")
    tarball = tarball_path(kit_dir)
    if tarball.exists():
        raise KitError(f"--kit {kit_dir}: {tarball} already exists; move it away first")
    return tarball


def tarball_path(kit_dir: Path) -> Path:
    """DIR.tar.gz beside DIR."""
    kit_dir = Path(kit_dir)
    return kit_dir.parent / f"{kit_dir.name}.tar.gz"


def build_kit(kit_dir: Path, *, cert: Path, ca_cert: Path, address: Address,
              plan: PublicPlan | None = None) -> Path:
    """Write the kit folder and its tarball; return the tarball's path.

    `cert` is the silo's signed certificate and `ca_cert` the federation's; `plan` pre-fills the
    policy template. Nothing is written unless every file passes the private-key check.
    """
    kit_dir = Path(kit_dir)
    tarball = check_empty_folder(kit_dir)
    cert_pem, ca_pem = _read(cert), _read(ca_cert)
    try:
        name = verify_certificate(cert_pem, ca_pem)
    except PkiError as exc:
        raise KitError(f"{cert}: {exc}") from None
    if certificate_subject(cert_pem) != name:
        raise KitError(f"{cert}: subject does not match")
    files = kit_files(name, address, cert_pem=cert_pem, ca_pem=ca_pem, plan=plan,
                      folder=kit_dir.name)
    for file_name, data in files.items():
        if holds_private_key(data):
            raise KitError(f"refusing to put {file_name} in the kit: it is or holds a private key")
    kit_dir.mkdir(parents=True, exist_ok=True)
    for file_name, data in files.items():
        write_atomic(kit_dir / file_name, partial(_write, data=data))
        (kit_dir / file_name).chmod(0o644)
    archive = _tarball(kit_dir.name, files)
    write_atomic(tarball, lambda handle: handle.write(archive))
    return tarball


def kit_files(name: str, address: Address, *, cert_pem: bytes, ca_pem: bytes,
              plan: PublicPlan | None = None, folder: str = "kit") -> dict[str, bytes]:
    """Every file of a silo's kit, by name, in the order the README lists them."""
    return {
        README_FILE: readme_text(name, address, plan, folder).encode(),
        CA_CERT: ca_pem,
        f"{name}.crt": cert_pem,
        ADDRESS_FILE: f"{address}\n".encode(),
        POLICY_FILE: policy_template(name, plan).encode(),
        unit_name(name): systemd_unit(name, address).encode(),
        COMPOSE_FILE: compose_service(name, address).encode(),
    }


def unit_name(name: str) -> str:
    """The systemd unit's file name for a silo."""
    return f"trellis-silo-{name}.service"


def _write(handle: BinaryIO, *, data: bytes) -> None:
    handle.write(data)


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise KitError(f"cannot read {path}: {exc.strerror}") from None


def _tarball(folder: str, files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for file_name, data in files.items():
            info = tarfile.TarInfo(f"{folder}/{file_name}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# -- templates ------------------------------------------------------------------------------

def policy_template(name: str, plan: PublicPlan | None = None) -> str:
    """A policy file with every clause commented out (as shipped it accepts any plan).

    With a plan, each clause holds that plan's value, so uncommenting them all accepts exactly
    plans like it (same algorithm, no more rounds, the same shared tensors and thresholds).
    """
    if plan is None:
        head = ("# The values below are examples; set your own before uncommenting.\n")
        values = {
            "algorithms": '["fedstar", "feddense"]', "max_rounds": "200",
            "shared_tensors": '["embedding_s", "graph_convs_s_gcn"]',
            "min_aggregate_silos": "3", "min_threshold": "3", "ring_bits": "[64]",
            "reveal_unweighted_sum": "false", "reveal_update_norms": "false"}
    else:
        row = algorithm(plan.algorithm)
        fewest = 2 if row.clustered else plan.aggregation.threshold
        head = (f"# The values below are those of the plan of federation {plan.federation} "
                f"({plan.algorithm},\n# {plan.rounds} rounds): uncommenting them all accepts "
                "that plan and refuses one that asks for\n# more.\n")
        values = {
            "algorithms": f'["{plan.algorithm}"]', "max_rounds": str(plan.rounds),
            "shared_tensors": "[" + ", ".join(f'"{g}"' for g in row.shares) + "]",
            "min_aggregate_silos": str(max(fewest, 1)), "min_threshold": str(max(fewest, 1)),
            "ring_bits": f"[{plan.aggregation.ring_bits}]",
            "reveal_unweighted_sum": str(plan.aggregation.unweighted_sum).lower(),
            "reveal_update_norms": str(row.clustered).lower()}
    notes = {
        "algorithms": "algorithms this silo takes part in",
        "max_rounds": "most rounds it trains for",
        "shared_tensors": "parameter groups that may leave it, masked",
        "min_aggregate_silos": "fewest silos in any unmasked sum",
        "min_threshold": "least secure-aggregation threshold",
        "ring_bits": "accepted ring sizes, out of 32 and 64",
        "reveal_unweighted_sum": "false refuses GCFL's plain unweighted cluster sum",
        "reveal_update_norms": "false refuses GCFL and GCFL+, which send per-silo norms in plain",
    }
    lines = [f"#   {notes[clause]}:\n# {clause} = {values[clause]}" for clause in notes]
    return (f"# Policy of silo {name}: which plans it takes part in.\n"
            "# Use it with: silo join ... --policy policy.toml\n"
            "# Every clause is optional and commented out: as shipped, this file accepts any\n"
            "# plan. Remove the leading '# ' of a clause to enforce it; a plan that breaks one\n"
            "# is refused before anything leaves the silo (exit 2).\n"
            + head + "\n[accept]\n" + "\n".join(lines) + "\n" + _privacy_clauses(plan))


def _privacy_clauses(plan: PublicPlan | None) -> str:
    """The policy's [privacy] table, commented out: the plan's own values where it has them, so
    that uncommenting them all accepts it (silo/privacy/dp_policy.py)."""
    p = None if plan is None else plan.privacy
    if p is None or not p.enabled:
        values = {"required": "false" if plan is not None else "true", "max_epsilon": "8.0",
                  "max_delta": "1e-5", "min_noise_multiplier": "0.8", "min_colluders": "1",
                  "min_threshold": "3", "max_clip": "1.0", "max_rounds": "500",
                  "unit": '"record"', "mechanisms": '["ddg", "local-gaussian"]'}
    else:
        assert plan is not None
        values = {"required": "true", "max_epsilon": f"{p.epsilon:g}" if p.epsilon else "8.0",
                  "max_delta": f"{p.delta:g}", "min_noise_multiplier": f"{p.noise_multiplier:g}",
                  "min_colluders": str(p.colluders),
                  "min_threshold": str(plan.aggregation.threshold), "max_clip": f"{p.clip:g}",
                  "max_rounds": str(plan.rounds), "unit": f'"{p.unit}"',
                  "mechanisms": f'["{p.mechanism}"]'}
    notes = {
        "required": "true refuses plans without differential privacy",
        "max_epsilon": "the most epsilon this silo spends on its own graphs in the federation",
        "max_delta": "the largest delta (keep it below 1 / your number of training graphs)",
        "min_noise_multiplier": "the least noise multiplier z of every unmasked sum",
        "min_colluders": "silos the plan must assume collude with the coordinator",
        "min_threshold": "least secure-aggregation threshold the noise is calibrated to",
        "max_clip": "largest clip norm of one graph's (or one silo's) contribution",
        "max_rounds": "most private rounds", "unit": "\"record\" (one graph) or \"silo\"",
        "mechanisms": "accepted mechanisms",
    }
    lines = [f"#   {notes[clause]}:\n# {clause} = {values[clause]}" for clause in notes]
    return ("\n# Differential privacy (docs/privacy.md): what this silo demands of the plan's "
            "[privacy] table.\n# Adding on_exhausted = \"stop\" joins a plan whose whole run "
            "would exceed max_epsilon and\n# leaves before the first round that could; by "
            "default such a plan is refused on joining.\n[privacy]\n" + "\n".join(lines) + "\n")



def readme_text(name: str, address: Address, plan: PublicPlan | None = None,
                folder: str = "kit") -> str:
    """The silo operator's instructions, with this silo's name and address filled in."""
    federation = (f"federation {plan.federation} ({plan.algorithm}, {plan.rounds} rounds)"
                  if plan is not None else "the federation")
    described = {
        CA_CERT: "the federation's CA: your silo checks the coordinator with it",
        f"{name}.crt": "your silo's certificate, for the key you hold",
        ADDRESS_FILE: f"the address your silo dials: {address}",
        POLICY_FILE: "which plans your silo accepts (as shipped: any)",
        unit_name(name): "a systemd unit for this silo",
        COMPOSE_FILE: "a compose service for this silo",
    }
    width = max(map(len, described)) + 2
    files = "\n".join(f"  {file_name.ljust(width)}{text}" for file_name, text in described.items())
    title = f"Trellis onboarding kit for silo {name}"
    return _README.format(title=title, rule="=" * len(title), name=name, address=address,
                          federation=federation, version=package_version(),
                          unit=unit_name(name), ca=CA_CERT, policy=POLICY_FILE,
                          compose=COMPOSE_FILE, files=files, kit=folder)


def systemd_unit(name: str, address: Address) -> str:
    """A systemd unit for this silo (deploy/systemd/trellis-silo.service, filled in)."""
    return _UNIT.format(name=name, address=address, unit=unit_name(name))


def compose_service(name: str, address: Address) -> str:
    """A compose service for this silo, to merge into a compose.yaml."""
    return _COMPOSE.format(name=name, address=address)


_README = """\
{title}
{rule}

Your certificate for {federation}, signed by its
coordinator operator, and what you need to join. This kit holds NO private key: your key
({name}.key) was made on your machine by `silo pki request` and never leaves it.

Files (in {kit}/, or unpacked from {kit}.tar.gz with `tar xzf {kit}.tar.gz`)
-----
{files}

The commands below run in the folder that holds your identity folder id/, your graph
folder graphs/ and this kit's folder {kit}/.

1. Install (Python 3.11+), then check
-------------------------------------
  CPU silo:
    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    pip install 'trellis-fgl[silo]'
  CUDA silo: first the torch 2.13.0 wheel that matches your NVIDIA driver, from
    https://download.pytorch.org/whl/<cuXXX> (PyTorch's install page lists the CUDA
    variants), then: pip install 'trellis-fgl[silo]'

  silo --version
The coordinator that made this kit runs trellis-fgl {version}; yours should show the same
version (a coordinator refuses a silo that speaks another protocol).

2. Put the certificates beside your key
---------------------------------------
You ran `silo pki request --name {name} --dir id/`, which left id/{name}.key and
id/{name}.csr. Copy the two certificates into that same folder:

  cp {kit}/{name}.crt {kit}/{ca} id/
  ls id/        # {ca}  {name}.crt  {name}.csr  {name}.key

3. Your policy (optional, but read it)
--------------------------------------
  cp {kit}/{policy} policy.toml   # remove the '# ' before each clause you want enforced

4. Join
-------
  silo join --coordinator {address} --data graphs/ --identity id/ --policy policy.toml

--data is your TU-format graph folder. The silo retries while the coordinator is not up
yet (--connect-timeout S, default 300), trains each round on your machine and sends only
the masked tensors the algorithm declares shareable.

To run it as a service: copy {unit} to /etc/systemd/system/, adjust the
paths and the user, then `systemctl enable --now {unit}`; or merge
{compose} into your compose file.

Exit codes of `silo join`
-------------------------
  0  the federation finished; the final model is in the state folder (silo-state/{name})
  1  the federation failed, or the coordinator was never reached: retrying may help
  2  a mistake of configuration that retrying cannot fix: bad data folder, identity (key,
     certificate, {ca}), options or policy file; a coordinator that refuses this silo
     (certificate, name, version); or a plan your --policy refuses. The line it prints
     last says which.

Progress: silo status --state-dir silo-state/{name} --identity id/
"""

_UNIT = """\
# systemd unit for Trellis silo {name}. Copy to /etc/systemd/system/{unit}, adjust the paths
# and the user, then: systemctl enable --now {unit}
#
# Restart=on-abnormal restarts after a crash, a kill or an out-of-memory kill; the silo then
# goes on from the model, optimiser and round counter in its --state-dir (resume.pt). A
# deliberate exit (0 done, 1 refused or federation failed, 2 bad data or identity) is final.
# --connect-timeout covers a coordinator that is itself being restarted or upgraded.
[Unit]
Description=Trellis federated graph learning silo {name}
Wants=network-online.target
After=network-online.target
StartLimitIntervalSec=3600
StartLimitBurst=5

[Service]
Type=simple
User=trellis
WorkingDirectory=/srv/trellis/silo
ExecStart=/srv/trellis/.venv/bin/silo join --coordinator {address} \\
    --data /srv/trellis/silo/graphs --identity /srv/trellis/silo/id \\
    --state-dir /srv/trellis/silo/state --policy /srv/trellis/silo/policy.toml \\
    --connect-timeout 3600
Restart=on-abnormal
RestartSec=5
# `systemctl stop` sends SIGTERM: it stops as for Ctrl-C and exits 143, a clean stop.
SuccessExitStatus=143
# The silo's data, key, model and group secrets are readable by this user only.
UMask=0077
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=yes
ReadOnlyPaths=/srv/trellis/silo/graphs /srv/trellis/silo/id /srv/trellis/silo/policy.toml
ReadWritePaths=/srv/trellis/silo/state

[Install]
WantedBy=multi-user.target
"""

_COMPOSE = """\
# Compose service for Trellis silo {name}: merge into your compose.yaml. The image is built
# from the Trellis repository (docs/deploy.md, "Container images"):
#   docker build -f deploy/docker/silo.Dockerfile -t trellis/silo .
# The container runs as uid 10001: give it the key and the state folder first
#   sudo chown -R 10001:10001 id state       (the key stays mode 600; the silo checks)
# Compose cannot tell a crash from a deliberate exit (1 or 2, see README.txt), so it
# retries any failure a few times; each retry goes on from ./state.
services:
  silo-{name}:
    image: trellis/silo:latest
    command: ["join", "--coordinator", "{address}", "--data", "/data",
              "--identity", "/etc/trellis/identity", "--state-dir", "/var/lib/trellis/state",
              "--policy", "/etc/trellis/policy.toml", "--connect-timeout", "3600"]
    volumes:
      - ./graphs:/data:ro
      - ./id:/etc/trellis/identity:ro
      - ./policy.toml:/etc/trellis/policy.toml:ro
      - ./state:/var/lib/trellis/state
    read_only: true
    tmpfs: [/tmp]
    cap_drop: [ALL]
    security_opt: ["no-new-privileges:true"]
    restart: on-failure:5
"""
