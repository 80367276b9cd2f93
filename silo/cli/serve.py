"""`silo serve`: a standing silo that takes part in the jobs of a standing coordinator."""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.protos.devices import DEVICE_HELP, check_device_spec
from trellis.silo.cli.exits import EXIT_BAD_INPUT, fail


def serve(coordinator: str = typer.Option(..., "--coordinator", help="host:port of the "
                                          "standing coordinator"),
          identity: Path = typer.Option(Path("id"), "--identity",
                                        help="folder with this silo's key, certificate, ca.crt"),
          data: list[str] = typer.Option(..., "--data", help="NAME=PATH: a dataset this silo "
                                         "holds, named as plans name it (federation.dataset); "
                                         "repeat for several"),
          policy_file: Path = typer.Option(None, "--policy",
                                           help="TOML file of the plans this silo accepts; its "
                                                "\\[jobs] table says whether jobs are approved "
                                                "automatically or by `silo jobs approve`"),
          state_root: Path = typer.Option(Path("silo-state"), "--state-root",
                                          help="the site's job records and audit log, and one "
                                               "folder per job"),
          max_jobs: int = typer.Option(1, "--max-jobs", min=1, max=16,
                                       help="jobs taken part in at once"),
          device: str = typer.Option("auto", help=f"{DEVICE_HELP}, for every job"),
          threads: int = typer.Option(None, help="torch threads per job (default: all cores)"),
          report: str = typer.Option(None, help="metrics to report, comma-separated, or "
                                                 "'none' (default: val_acc,test_acc,train_loss "
                                                 "and the plan's training.validation_metric)"),
          log_format: str = typer.Option("text", "--log-format",
                                         help="text (for people) or json (one object per "
                                              "line, for log shippers)"),
          init_models: Path = typer.Option(None, "--init-models",
                                           help="a folder of public initial models: a job "
                                                "whose plan names one by its SHA-256 "
                                                "(model.init_sha256) starts from it; without it "
                                                "here, the job is refused")) -> None:
    """Stay connected to a standing coordinator: decide each job offered by the policy (or hold
    it for `silo jobs approve`), and take part in the jobs approved, one process each."""
    from trellis.crypto.audit import AuditLog
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import load_identity
    from trellis.protos.fields import valid_address, valid_name
    from trellis.protos.logs import FORMATS, make_logger
    from trellis.protos.stop import exit_code, stop_on_sigterm
    from trellis.silo.jobs.standing import SiteConfig, SiteRefused, StandingSilo
    from trellis.silo.jobs.store import SiteJobError, SiteJobStore
    from trellis.silo.privacy.policy import PolicyError, load_policy

    if log_format not in FORMATS:
        fail(f"--log-format {log_format!r}: expected one of {', '.join(FORMATS)}")
    if not valid_address(coordinator):
        fail(f"--coordinator {coordinator!r}: expected host:port, e.g. "
             "coord.example.org:50051")
    try:
        if check_device_spec(device).startswith("cuda"):
            # Here, once, not in every job's process after approval; only a GPU can be missing,
            # and only then is torch loaded (seconds) before the silo connects.
            from trellis.silo.training.devices import resolve_device

            resolve_device(device)
    except ValueError as exc:
        fail(str(exc))
    datasets: dict[str, Path] = {}
    for item in data:
        name, sep, path = item.partition("=")
        if not sep or not valid_name(name) or not path:
            fail(f"--data {item!r}: expected NAME=PATH, e.g. --data chem=./graphs/chem")
        if name in datasets:
            fail(f"--data: the dataset {name!r} is given twice")
        folder = Path(path)
        if not folder.is_dir():
            fail(f"--data {item}: no such folder {folder}")
        datasets[name] = folder.resolve()
    held: dict[str, Path] = {}
    if init_models is not None:
        if not init_models.is_dir():
            fail(f"--init-models {init_models}: no such folder")
        held = _initial_models(init_models)
    policy = None
    if policy_file is not None:
        try:
            policy = load_policy(policy_file)
        except PolicyError as exc:
            fail(str(exc))
    try:
        ident = load_identity(identity)
    except CryptoError as exc:
        fail(str(exc))
    state_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        store = SiteJobStore.open(state_root / "jobs.sqlite")
    except (SiteJobError, OSError) as exc:
        fail(str(exc))
    options = ["--device", device, "--log-format", log_format, "--connect-timeout", "600"]
    if report is not None:
        options += ["--report", report]
    if threads is not None:
        options += ["--threads", str(threads)]
    config = SiteConfig(coordinator=coordinator, identity_dir=identity.resolve(),
                        identity=ident, datasets=datasets, state_root=state_root.resolve(),
                        policy=policy,
                        policy_file=policy_file.resolve() if policy_file else None,
                        max_jobs=max_jobs, join_options=tuple(options), init_models=held)
    audit = AuditLog(state_root / "audit.jsonl", writer=ident.name,
                     signing_key_pem=ident.key_pem)
    audit.append("serving", coordinator=coordinator, datasets=sorted(datasets),
                 max_jobs=max_jobs, **({"policy_sha256": policy.sha256} if policy else {}),
                 **({"init_models": sorted(held)} if held else {}))
    log = make_logger(ident.name, log_format).info
    site = StandingSilo(config, store, audit, log)
    stop_on_sigterm()
    try:
        site.run()
    except SiteRefused as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except KeyboardInterrupt as exc:
        log("stopped; jobs this silo takes part in resume when `silo serve` starts again")
        raise typer.Exit(exit_code(exc)) from None
    finally:
        audit.close()
        store.close()


def _initial_models(folder: Path) -> dict[str, Path]:
    """Each file of the folder by its SHA-256 (what a plan's [model] init_sha256 names)."""
    import hashlib

    held = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        with open(path, "rb") as handle:
            held[hashlib.file_digest(handle, "sha256").hexdigest()] = path.resolve()
    return held
