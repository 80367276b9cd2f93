"""The text files of a silo's onboarding kit: README, systemd unit and its environment file,
compose service, each with the silo's name, the coordinator's address and its dataset filled in.

The kit sets the silo up as a standing silo (`silo serve`, as deploy/systemd/trellis-silo.service
and deploy/compose/compose.yaml run it); `silo join`, one experiment, is the README's alternative.
Names of the kit's files are here too, so the README lists exactly what the builder writes.
"""

from __future__ import annotations

from trellis.crypto.pki import CA_CERT
from trellis.protos.plan import PublicPlan
from trellis.protos.version import package_version

ADDRESS_FILE = "coordinator.txt"
POLICY_FILE = "policy.toml"
README_FILE = "README.txt"
COMPOSE_FILE = "compose.yaml"
# The names deploy/systemd gives them: the kit's are filled-in copies.
UNIT_FILE = "trellis-silo.service"
ENV_FILE = "trellis-silo.env"
# The dataset name `silo serve --data NAME=graphs/` gives the silo's graphs when the kit is
# made without a job plan that names one (federation.dataset).
DEFAULT_DATASET = "graphs"


def dataset_name(plan: PublicPlan | None) -> str:
    """The dataset a job plan names (federation.dataset), else DEFAULT_DATASET."""
    return plan.dataset if plan is not None and plan.dataset else DEFAULT_DATASET


def readme_text(name: str, address: object, plan: PublicPlan | None = None,
                folder: str = "kit") -> str:
    """The silo operator's instructions, with this silo's name and address filled in."""
    described = {
        CA_CERT: "the federation's CA: your silo checks the coordinator with it",
        f"{name}.crt": "your silo's certificate, for the key you hold",
        ADDRESS_FILE: f"the address your silo dials: {address}",
        POLICY_FILE: "which jobs your silo accepts (as shipped: any, held for you)",
        UNIT_FILE: "a systemd unit for this standing silo (`silo serve`)",
        ENV_FILE: "its options (/etc/trellis/silo.env), the address filled in",
        COMPOSE_FILE: "a compose service for this standing silo",
    }
    width = max(map(len, described)) + 2
    files = "\n".join(f"  {file_name.ljust(width)}{text}" for file_name, text in described.items())
    title = f"Trellis onboarding kit for silo {name}"
    prefilled = ("" if plan is None else
                 f"\nIt is pre-filled from the plan {plan.federation} ({plan.algorithm}, "
                 f"{plan.rounds} rounds):\nuncommenting every clause accepts that very plan "
                 "(by its SHA-256) and refuses one that asks for more.\n")
    return _README.format(title=title, rule="=" * len(title), name=name, address=address,
                          version=package_version(), unit=UNIT_FILE, env=ENV_FILE, ca=CA_CERT,
                          policy=POLICY_FILE, compose=COMPOSE_FILE, files=files, kit=folder,
                          dataset=dataset_name(plan), prefilled=prefilled)


def systemd_unit(name: str) -> str:
    """A systemd unit for this silo (deploy/systemd/trellis-silo.service, filled in); its
    options are in the environment file (`environment_file`)."""
    return _UNIT.format(name=name, unit=UNIT_FILE, env=ENV_FILE, exec_start=_EXEC_START)


def environment_file(name: str, address: object, plan: PublicPlan | None = None) -> str:
    """The unit's environment file (deploy/systemd/trellis-silo.env, filled in)."""
    return _ENV.format(name=name, address=address, dataset=dataset_name(plan))


def compose_service(name: str, address: object, plan: PublicPlan | None = None) -> str:
    """A compose service for this silo (the silos of deploy/compose/compose.yaml), to merge
    into a compose.yaml."""
    return _COMPOSE.format(name=name, address=address, dataset=dataset_name(plan))


# One line, as systemd and deploy/systemd/trellis-silo.service have it.
_EXEC_START = ("/srv/trellis/.venv/bin/silo serve --coordinator ${TRELLIS_COORDINATOR_ADDRESS} "
               "--identity /srv/trellis/silo/id $TRELLIS_DATA --policy "
               "/srv/trellis/silo/policy.toml --state-root /srv/trellis/silo/state "
               "$TRELLIS_SILO_OPTIONS")

_README = """\
{title}
{rule}

Your silo's certificate, signed by the coordinator operator of the federation at
{address}, and what you need to run the silo. This kit holds NO private key: your key
({name}.key) was made on your machine by `silo pki request` and never leaves it.

Files: in {kit}/, or unpacked from {kit}.tar.gz with
  tar xzf {kit}.tar.gz
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

3. Your policy (read it)
------------------------
  cp {kit}/{policy} policy.toml
Then remove the '# ' before each clause you want enforced.

Its [accept] and [privacy] clauses say which plans your silo takes part in at all; its [jobs]
table whose jobs count and whether an acceptable job runs at once (approve = "auto") or waits
for you (approve = "manual", the default). As shipped it accepts any plan and holds every job
for you.
{prefilled}
4. Run your silo
----------------
  silo serve --coordinator {address} --identity id/ \\
      --data {dataset}=graphs/ --policy policy.toml --state-root state/

This is a standing silo: it stays connected to the coordinator (and waits for it while it is
down or restarting) until you stop it (Ctrl-C, or SIGTERM: exit 143; exit 2 is a mistake of
configuration it names in its last line). --data NAME=PATH names a dataset as job plans name
it (federation.dataset = "{dataset}"); give one --data for each dataset you hold. state/ keeps
the silo's job records (jobs.sqlite), its audit log (audit.jsonl) and one folder per job it
takes part in (state/jobs/<id>/: the job's audit log, metrics and final model). Your graphs
never leave this machine: each round trains here and sends only the masked tensors the
algorithm declares shareable.

5. Job offers
-------------
An operator of the federation (someone holding an operator certificate of its CA) submits a
job: a plan (the algorithm, the rounds, the silos, the dataset), signed with their key. The
coordinator offers it to every silo the plan names. Your silo checks the signature and the
plan against your policy: a job that breaks a clause, names a dataset you do not serve or
comes from an operator your [jobs] table does not name is refused at once, with one line
saying why. An acceptable job runs at once with approve = "auto"; with "manual" (as shipped)
it waits for your answer:

  silo jobs list --state-root state/
  silo jobs show 1 --state-root state/       # the plan, its operator, its SHA-256
  silo jobs approve 1 --state-root state/
  silo jobs refuse 1 --reason "not our study" --state-root state/

These read and write your silo's own job store (no network); `silo serve` sends the answer.
A job starts once enough of its silos approved; your silo runs it as a process of its own.

6. As a service
---------------
systemd: {unit} is Trellis's deploy/systemd/trellis-silo.service with this
silo's name, and {env} its options with your coordinator's address. Put id/,
policy.toml and graphs/ in /srv/trellis/silo/ (or edit the paths; check --data in
{env}), then, as root:

    useradd --system --home-dir /srv/trellis --shell /usr/sbin/nologin trellis
    install -d -o trellis -g trellis -m 0700 /srv/trellis/silo/state
    install -D -m 0644 {kit}/{env} /etc/trellis/silo.env
    cp {kit}/{unit} /etc/systemd/system/
    systemctl enable --now trellis-silo
    sudo -u trellis /srv/trellis/.venv/bin/silo jobs list \\
        --state-root /srv/trellis/silo/state

compose: merge {compose} into your compose file (it runs the trellis/silo image);
and see (approve, refuse) job offers with

    docker compose exec silo-{name} silo jobs list \\
        --state-root /var/lib/trellis/state

One experiment instead: `silo join`
-----------------------------------
Where the coordinator operator runs one federation of one plan (`coordinator serve --plan`)
rather than a standing coordinator, your silo joins that one federation and ends with it:

  silo join --coordinator {address} --data graphs/ --identity id/ \\
      --policy policy.toml

It retries while that coordinator is not up yet (--connect-timeout S, default 300), then
exits 0 when the federation finished (the final model is in silo-state/{name}), 1 when it
failed or the coordinator was never reached (retrying may help), 2 on a mistake retrying
cannot fix (bad data folder, identity, options or policy file; a coordinator that refuses
this silo; a plan your policy refuses), its last line saying which. Its progress:

  silo status --state-dir silo-state/{name} --identity id/
"""

_UNIT = """\
# systemd unit for Trellis standing silo {name} (`silo serve`): Trellis's
# deploy/systemd/trellis-silo.service with its name. It stays connected to the consortium's
# coordinator, decides each job offered by its policy (policy.toml, its [jobs] table) and takes
# part in the jobs it approves, each a child process with its own folder under the state root.
# It never ends by itself, so it is always restarted; jobs it takes part in resume. Install
# (the kit's README.txt, step 6):
#   useradd --system --home-dir /srv/trellis --shell /usr/sbin/nologin trellis
#   install -d -o trellis -g trellis -m 0700 /srv/trellis/silo/state
#   install -D -m 0644 {env} /etc/trellis/silo.env   # the address filled in
#   cp {unit} /etc/systemd/system/ && systemctl enable --now trellis-silo
# Under /srv/trellis/silo: id/ (key, certificate, ca.crt), policy.toml, the datasets (read
# only), state/ (jobs.sqlite, the site's audit log, jobs/<id>/). Answer a job held for you:
#   sudo -u trellis /srv/trellis/.venv/bin/silo jobs approve ID --state-root /srv/trellis/silo/state
[Unit]
Description=Trellis standing silo {name} (silo serve)
Wants=network-online.target
After=network-online.target
# A silo that cannot start (a bad option, a missing data folder, a coordinator that refuses
# its certificate: exit 2) is not restarted for ever: systemd gives up after five starts within
# ten minutes (`systemctl reset-failed trellis-silo` to try again).
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
Type=simple
User=trellis
Group=trellis
# The coordinator's address, the datasets and the other options of `silo serve`.
EnvironmentFile=/etc/trellis/silo.env
WorkingDirectory=/srv/trellis/silo
ExecStart={exec_start}
Restart=always
RestartSec=10
# `systemctl stop` sends SIGTERM to silo serve alone (KillMode=mixed): it stops its jobs'
# processes itself (SIGTERM, SIGKILL after 15 s) and exits 143, a clean stop.
KillMode=mixed
TimeoutStopSec=60
SuccessExitStatus=143
Environment=TRELLIS_PROGRESS=0
# The dense-layer path a job measures once is kept with the state (ProtectSystem below).
Environment=XDG_CACHE_HOME=/srv/trellis/silo/state/.cache
# The silo's data, key, models and group secrets are readable by this user only; the whole
# file system is read-only to it but the state root.
UMask=0077
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=yes
ReadWritePaths=/srv/trellis/silo/state
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
CapabilityBoundingSet=
SystemCallArchitectures=native
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
# No PrivateDevices=: a job may train on a GPU (/dev/nvidia*).

[Install]
WantedBy=multi-user.target
"""

_ENV = """\
# The options of silo {name}'s trellis-silo.service (`silo serve`), as
# /etc/trellis/silo.env (deploy/systemd/trellis-silo.env, filled in). systemd reads KEY=value
# lines; the unit's ExecStart takes ${{KEY}} as one word and $KEY split at spaces. `silo serve
# --help` lists every option.

# host:port of the standing coordinator: the name on its server certificate.
TRELLIS_COORDINATOR_ADDRESS={address}
# Each dataset this silo holds, named as job plans name it (federation.dataset):
# --data NAME=PATH, once per dataset.
TRELLIS_DATA=--data {dataset}=/srv/trellis/silo/graphs
# Jobs taken part in at once, the device and torch threads of each job, the log format.
TRELLIS_SILO_OPTIONS=--max-jobs 1 --device auto --log-format text
"""

_COMPOSE = """\
# Compose service for Trellis standing silo {name}: `silo serve`, as the silos of
# Trellis's deploy/compose/compose.yaml run it. Merge it into your compose.yaml. The image is
# built from the Trellis repository (docs/deploy.md, "Container images"):
#   docker build -f deploy/docker/silo.Dockerfile -t trellis/silo .
# The container runs as uid 10001: give it the key and the state folder first
#   sudo chown -R 10001:10001 id state       (the key stays mode 600; the silo checks)
# It never ends by itself: back after a crash or a reboot, down after `docker compose stop`.
# Answer a job held for you (the kit's README.txt, step 5):
#   docker compose exec silo-{name} silo jobs approve ID --state-root /var/lib/trellis/state
services:
  silo-{name}:
    image: trellis/silo:latest
    command: ["serve", "--coordinator", "{address}",
              "--identity", "/etc/trellis/identity", "--data", "{dataset}=/data",
              "--policy", "/etc/trellis/policy/policy.toml",
              "--state-root", "/var/lib/trellis/state"]
    volumes:
      - ./graphs:/data:ro
      - ./id:/etc/trellis/identity:ro
      - ./policy.toml:/etc/trellis/policy/policy.toml:ro
      - ./state:/var/lib/trellis/state
    read_only: true
    tmpfs: [/tmp]
    cap_drop: [ALL]
    security_opt: ["no-new-privileges:true"]
    restart: unless-stopped
"""
