"""``coordinator`` command line: serve, simulate, status, report, pki and audit.

Exit codes: 0 success; 1 the federation failed, an audit log does not verify, or two logs
disagree; 2 bad input (plan, files, certificates) -- always reported as one readable line;
130 and 143 `serve` stopped by Ctrl-C or SIGTERM (resumable).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from trellis.coordinator.pki.onboarding import Address
    from trellis.crypto.audit import AuditReport
    from trellis.protos.plan import Plan, PublicPlan

app = typer.Typer(help="Trellis coordinator: runs federated rounds for admitted silos.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
pki_app = typer.Typer(help="Federation certificate authority.", no_args_is_help=True)
audit_app = typer.Typer(help="Audit-log tools for compliance review.", no_args_is_help=True)
app.add_typer(pki_app, name="pki")
app.add_typer(audit_app, name="audit")


def _show_version(value: bool) -> None:
    if value:
        from trellis.protos.version import version_line

        typer.echo(version_line("coordinator"))
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version,
                                       is_eager=True, help="show the version and exit")
          ) -> None:
    """Trellis coordinator."""


EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load_plan(path: Path):  # type: ignore[no-untyped-def]
    from trellis.protos.plan import PlanError, load_plan

    try:
        return load_plan(path)
    except PlanError as exc:
        typer.echo(f"error: invalid plan {path}:", err=True)
        for problem in exc.problems:
            typer.echo(f"  - {problem}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


@app.command()
def serve(plan: Path = typer.Option(..., "--plan", help="plan.toml of the federation"),
          listen: str = typer.Option(None, help="override server.listen (host:port)"),
          quiet: bool = typer.Option(False, help="no progress lines"),
          capture: Path = typer.Option(None, help="record every received message to this file "
                                                  "(wire capture for review)"),
          health_listen: str = typer.Option(None, "--health-listen",
                                            help="also serve the gRPC health status in plain "
                                                 "text at host:port, for probes without a "
                                                 "certificate; keep it inside the pod/host "
                                                 "network"),
          metrics_listen: str = typer.Option(None, "--metrics-listen",
                                             help="serve Prometheus metrics at "
                                                  "http://host:port/metrics"),
          linger: float = typer.Option(0.0, "--linger", min=0.0,
                                       help="seconds to keep the health and metrics endpoints "
                                            "up after the federation ends, so the last "
                                            "scrape sees its end"),
          log_format: str = typer.Option("text", "--log-format",
                                         help="text (for people) or json (one object per "
                                              "line, for log shippers)")) -> None:
    """Run a federation: listen over mTLS, drive the rounds, write results and audit log."""
    from trellis.coordinator.serving.allocator import return_large_buffers
    from trellis.coordinator.serving.observability import open_endpoints
    from trellis.coordinator.serving.service import serve_until_done, start_server
    from trellis.coordinator.state.checkpoint import RESULTS, finished_run
    from trellis.coordinator.state.results import accuracy_table
    from trellis.protos.exposition import EndpointError
    from trellis.protos.logs import FORMATS, event, make_logger
    from trellis.protos.stop import (
        EXIT_GRACE_S,
        describe,
        exit_code,
        exit_within,
        stop_on_sigterm,
    )

    if log_format not in FORMATS:
        _fail(f"--log-format {log_format!r}: expected one of {', '.join(FORMATS)}")
    log = make_logger("coordinator", log_format)

    return_large_buffers()     # before gRPC starts its threads (coordinator/serving/allocator.py)
    loaded = _load_plan(plan)
    state_dir = loaded.server.state_dir
    done = finished_run(state_dir, loaded)
    if done is not None:
        typer.echo(f"federation {loaded.federation} has finished: {done['rounds_completed']} "
                   f"rounds of {loaded.public.algorithm} completed; results: "
                   f"{state_dir / RESULTS}; audit log: {state_dir / 'audit.jsonl'}. Nothing "
                   "to serve: a new federation needs its own id and server.state_dir.",
                   err=True)
        raise typer.Exit(0)
    try:
        # Up before the federation service, so probes see NOT_SERVING while it starts.
        endpoints = open_endpoints(health_listen, metrics_listen)
    except EndpointError as exc:
        _fail(str(exc))
    stop_on_sigterm()     # docker stop, kubectl delete, systemctl stop: as Ctrl-C
    try:
        running = start_server(loaded, progress=not quiet, listen=listen, capture=capture,
                               health=endpoints.health, metrics=endpoints.metrics,
                               log_format=log_format)
    except (OSError, ValueError) as exc:
        endpoints.close()
        _fail(str(exc))
    except KeyboardInterrupt as exc:
        endpoints.close()
        event(log, logging.WARNING, "stopped while starting; nothing was served",
              event="interrupted")
        raise typer.Exit(exit_code(exc)) from None
    event(log, logging.INFO, f"coordinator listening on port {running.port} for federation "
          f"{loaded.federation} ({loaded.public.algorithm}, {loaded.public.rounds} rounds, "
          f"silos: {', '.join(loaded.silos)})", event="listening", port=running.port,
          federation=loaded.federation)
    for line in _privacy_lines(loaded):
        event(log, logging.INFO, line, event="privacy")
    try:
        results = serve_until_done(running)
    except KeyboardInterrupt as exc:
        endpoints.close()
        how = describe(exc)
        event(log, logging.WARNING, f"{how}; results so far in "
              f"{loaded.server.state_dir / 'results.json'}. Run `coordinator serve --plan "
              f"{plan}` again to resume at the last completed round.", event="interrupted")
        exit_within(EXIT_GRACE_S, exit_code(exc))
        raise typer.Exit(exit_code(exc)) from None
    except BaseException:
        endpoints.close()
        raise
    try:
        endpoints.linger(linger)
    except KeyboardInterrupt:
        endpoints.close()     # the federation has ended: a stop only cuts the linger short
    typer.echo(accuracy_table(results))
    typer.echo(f"results: {loaded.server.state_dir / 'results.json'}")
    typer.echo(f"audit log: {loaded.server.state_dir / 'audit.jsonl'}")
    if results["status"] != "completed":
        _fail(f"federation {results['status']}: {results['failure']}", EXIT_FAILED)


def _privacy_lines(plan: Plan) -> list[str]:
    """A private plan's mechanism and projected epsilon, said before round 1."""
    if not plan.public.privacy.enabled:
        return []
    from trellis.coordinator.rounds.privacy_report import privacy_lines  # a second to load

    return privacy_lines(plan)


@app.command()
def simulate(plan: Path = typer.Option(..., "--plan", help="plan.toml with a \\[simulation] "
                                                             "table: data = { silo = folder }"),
             out: Path = typer.Option(None, help="results file (default: state_dir/results-"
                                                 "simulation.json)"),
             threads: int = typer.Option(None, help="torch intra-op threads (with --engine "
                                                    "ray: in each silo's actor)"),
             quiet: bool = typer.Option(False, help="no progress lines"),
             engine: str = typer.Option("sequential", help="sequential: every silo in this "
                                                           "process, in turn; ray: each silo a "
                                                           "Ray actor, in parallel (the ray "
                                                           "extra); same results"),
             ray_address: str = typer.Option(None, "--ray-address",
                                             help="ray engine: join this Ray cluster (auto, "
                                                  "host:port or ray://host:port) instead of "
                                                  "starting a local Ray for the run"),
             ray_cpus: int = typer.Option(None, "--ray-cpus",
                                          help="ray engine: CPUs of the local Ray (default: "
                                               "this machine's)"),
             cpus_per_silo: float = typer.Option(None, "--cpus-per-silo",
                                                 help="ray engine: CPUs each silo's actor "
                                                      "reserves for the run (default 1; 0.5: "
                                                      "two silos per CPU)"),
             gpus_per_silo: float = typer.Option(None, "--gpus-per-silo",
                                                 help="ray engine: GPUs each silo's actor "
                                                      "reserves, fractions allowed (default 0: "
                                                      "train on CPUs)")) -> None:
    """Run the plan's algorithm on each silo's data folder, in this process or on Ray (for
    research)."""
    from trellis.coordinator.simulation.options import RayOptions, check_engine

    # Flags first, before the plan, torch or Ray are loaded: a typo fails at once.
    try:
        check_engine(engine)
    except ValueError as exc:
        _fail(str(exc))
    ray_flags = {"--ray-address": ray_address, "--ray-cpus": ray_cpus,
                 "--cpus-per-silo": cpus_per_silo, "--gpus-per-silo": gpus_per_silo}
    given = [flag for flag, value in ray_flags.items() if value is not None]
    if engine != "ray" and given:
        _fail(f"{', '.join(given)}: for --engine ray only (this run's engine is {engine})")
    options = None
    if engine == "ray":
        try:
            options = RayOptions(address=ray_address or "",
                                 cpus_per_silo=1.0 if cpus_per_silo is None else cpus_per_silo,
                                 gpus_per_silo=gpus_per_silo or 0.0, threads=threads,
                                 num_cpus=ray_cpus)
        except ValueError as exc:
            _fail(str(exc))
    loaded = _load_plan(plan)
    if loaded.silos_without_data:
        _fail("simulation.data has no folder for: " + ", ".join(loaded.silos_without_data))
    from trellis.coordinator.state.results import accuracy_table
    from trellis.protos.files import write_json_atomic
    from trellis.protos.stop import describe, exit_code, stop_on_sigterm

    try:
        # The simulation trains every silo's model: it needs the silo's torch.
        from trellis.coordinator.simulation import sequential as simulation
    except ImportError as exc:
        _fail(f"coordinator simulate trains the silos' models and needs torch ({exc}); install "
              "the silo extra: pip install 'trellis-fgl[silo]'")
    if options is not None:
        from trellis.coordinator.simulation import ray_engine

        try:
            ray_engine.import_ray()
        except ray_engine.RayMissing as exc:
            _fail(str(exc))
    if not quiet:
        for line in _privacy_lines(loaded):
            typer.echo(line)
    stop_on_sigterm()      # a stop unwinds the run as Ctrl-C does (a local Ray is shut down)
    try:
        if options is not None:
            # Each silo's actor reads its own folder, where it runs.
            results = simulation.simulate(loaded, engine="ray", ray=options,
                                          progress=not quiet)
        else:
            if threads:
                simulation.set_threads(threads)
            datasets = simulation.load_simulation_data(loaded)
            results = simulation.run_simulation(loaded, datasets, progress=not quiet)
    except ValueError as exc:       # bad data folders, or silos that do not fit the Ray cluster
        _fail(str(exc))
    except RuntimeError as exc:
        if options is None or not isinstance(exc, ray_engine.RayRunFailed):
            raise
        _fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt as exc:
        typer.echo(f"simulation {describe(exc)}; no results written", err=True)
        raise typer.Exit(exit_code(exc)) from None
    target = out or loaded.server.state_dir / "results-simulation.json"
    write_json_atomic(target, results)
    typer.echo(accuracy_table(results))
    typer.echo(f"results: {target}")
    if results["status"] != "completed":
        _fail(f"simulation {results['status']}: {results['failure']}", EXIT_FAILED)


@app.command()
def health(address: str = typer.Option("127.0.0.1:8081", "--address",
                                       help="the coordinator's --health-listen host:port"),
           timeout: float = typer.Option(3.0, help="seconds to wait for the answer")) -> None:
    """Ask a coordinator's plain health port whether it serves its federation: exit 0 when
    SERVING, 1 otherwise (for container health checks)."""
    from trellis.coordinator.serving.health import HealthUnreachable, probe
    from trellis.protos.fields import valid_address

    if not valid_address(address):
        _fail(f"--address {address!r}: expected host:port, e.g. 127.0.0.1:8081")
    try:
        status = probe(address, timeout)
    except HealthUnreachable as exc:
        _fail(str(exc), EXIT_FAILED)
    typer.echo(status)
    if status != "SERVING":
        raise typer.Exit(EXIT_FAILED)


@pki_app.command("init")
def pki_init(dir: Path = typer.Option(..., "--dir", help="folder for the CA (created)"),
             host: list[str] = typer.Option(..., "--host", help="name or IP silos dial; "
                                                                "repeatable"),
             federation: str = typer.Option("trellis", help="federation name in the CA")) -> None:
    """Create the federation CA and the coordinator's server certificate."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import init_ca

    try:
        init_ca(dir, host, federation=federation)
    except CryptoError as exc:
        _fail(str(exc))
    typer.echo(f"created CA and server certificate in {dir} for {', '.join(host)}")


@pki_app.command("sign")
def pki_sign(csr: Path = typer.Argument(..., help="a silo's .csr file"),
             ca: Path = typer.Option(..., "--ca", help="the CA folder from `pki init`"),
             out: Path = typer.Option(None, help="output folder (default: the CSR's folder)"),
             days: int = typer.Option(825, help="validity in days"),
             kit: Path = typer.Option(None, "--kit", help="also write the silo's onboarding kit "
                                                          "to this new or empty folder (and "
                                                          "FOLDER.tar.gz beside it)"),
             coordinator_address: str = typer.Option(None, "--coordinator-address",
                                                     help="host:port the silo dials (needed "
                                                          "with --kit)"),
             plan: Path = typer.Option(None, "--plan", help="with --kit: pre-fill the policy "
                                                            "template from this plan")) -> None:
    """Issue a silo certificate from its CSR (the silo's private key never comes here)."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import SERVER_CERT, sign_request

    kit_plan = None
    if kit is None:
        if coordinator_address is not None or plan is not None:
            _fail("--coordinator-address and --plan go with --kit FOLDER")
    else:
        kit_plan = _kit_checks(kit, coordinator_address, plan, ca / SERVER_CERT)
    try:
        cert = sign_request(csr, ca, days=days, out_dir=out)
    except CryptoError as exc:
        _fail(str(exc))
    typer.echo(f"issued {cert}; return it and {cert.parent / 'ca.crt'} to the silo operator")
    if kit is not None and kit_plan is not None:
        from trellis.coordinator.pki.onboarding import KitError, build_kit

        address, public, admitted = kit_plan
        try:
            tarball = build_kit(kit, cert=cert, ca_cert=cert.parent / "ca.crt", address=address,
                                plan=public)
        except KitError as exc:
            _fail(f"{exc} (the certificate {cert} was issued)")
        typer.echo(f"wrote onboarding kit {kit} and {tarball}; send the tarball to the silo "
                   "operator (it holds no private key)")
        name = cert.stem
        if admitted is not None and name not in admitted:
            typer.echo(f"note: {name} is not in federation.silos of {plan}; add it there "
                       "before `coordinator serve`, or the silo is refused")


def _kit_checks(kit: Path, address: str | None, plan: Path | None, server_cert: Path
                ) -> tuple[Address, PublicPlan | None, tuple[str, ...] | None]:
    """Check --kit's inputs before anything is signed: address, empty folder, plan."""
    from trellis.coordinator.pki.onboarding import (
        KitError,
        check_address_in_certificate,
        check_empty_folder,
        parse_address,
    )
    from trellis.protos.plan import PlanError, load_plan

    if address is None:
        _fail("--kit needs --coordinator-address host:port (where the silo dials the "
              "coordinator)")
    try:
        parsed = parse_address(address)
        check_empty_folder(kit)
        if server_cert.exists():
            check_address_in_certificate(parsed, server_cert.read_bytes())
    except KitError as exc:
        _fail(str(exc))
    if plan is None:
        return parsed, None, None
    try:
        loaded = load_plan(plan)
    except PlanError as exc:
        _fail(f"--plan {plan}: " + "; ".join(exc.problems))
    return parsed, loaded.public, loaded.silos


@pki_app.command("operator")
def pki_operator(name: str = typer.Option(..., "--name", help="the operator's name"),
                 ca: Path = typer.Option(..., "--ca", help="the CA folder from `pki init`"),
                 out: Path = typer.Option(..., "--out", help="folder for the key, certificate "
                                                            "and ca.crt (created)"),
                 days: int = typer.Option(365, help="validity in days")) -> None:
    """Issue an operator's key and certificate: `coordinator status --coordinator` with it;
    it opens nothing of the federation itself."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import issue_operator
    from trellis.crypto.revocation import issued_certificates

    try:
        # One name, one role: `pki revoke NAME` revokes every certificate of that name.
        silos = {c.name for c in issued_certificates(ca)
                 if not _is_operator_file(c.path)}
        if name in silos:
            _fail(f"{name!r} already names a silo certificate issued by {ca}; give the "
                  "operator a name of its own (see `coordinator pki list`)")
        cert = issue_operator(ca, name, out, days=days)
    except CryptoError as exc:
        _fail(str(exc))
    typer.echo(f"issued operator certificate {cert} (key {cert.with_suffix('.key')}, "
               f"{cert.parent / 'ca.crt'}); use it with `coordinator status --coordinator "
               f"HOST:PORT --identity {out}`")


def _is_operator_file(path: Path) -> bool:
    from trellis.crypto.pki import is_operator_certificate

    return is_operator_certificate(path.read_bytes())


@app.command()
def status(state_dir: Path = typer.Option(None, "--state-dir", help="the coordinator's "
                                          "server.state_dir (works while it runs and after)"),
           coordinator: str = typer.Option(None, "--coordinator", help="host:port of a running "
                                           "coordinator, asked over mTLS (needs --identity)"),
           identity: Path = typer.Option(None, "--identity", help="an operator's identity "
                                         "folder from `coordinator pki operator`"),
           timeout: float = typer.Option(10.0, help="seconds to wait for --coordinator"),
           as_json: bool = typer.Option(False, "--json", help="machine-readable status")
           ) -> None:
    """Where a federation stands: round and stage, silos, last metrics, time left."""
    from trellis.coordinator.operations import status as view

    if (state_dir is None) == (coordinator is None):
        _fail("give --state-dir DIR (the coordinator's state folder) or --coordinator "
              "HOST:PORT with --identity (an operator's identity), exactly one of them")
    if state_dir is not None:
        try:
            found, state, elapsed = view.local_view(state_dir)
        except ValueError as exc:
            _fail(str(exc))
    else:
        found, state, elapsed = _remote_status(coordinator, identity, timeout)
    if as_json:
        typer.echo(json.dumps(view.to_json(found, state, elapsed)))
    else:
        typer.echo(view.format_status(found, state, elapsed))


def _remote_status(target: str, identity: Path | None, timeout: float
                   ) -> tuple[Any, str, float]:
    """The status of a running coordinator over the Admin service (exit 2 if refused)."""
    from trellis.coordinator.operations.admin_client import (
        AdminRefused,
        AdminUnreachable,
        check_target,
        fetch_status,
    )
    from trellis.coordinator.operations.status import liveness
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import load_identity

    if identity is None:
        _fail("--coordinator needs --identity DIR: an operator's identity from `coordinator "
              "pki operator` (a silo's certificate is refused)")
    try:
        check_target(target)
        ident = load_identity(identity)
    except (ValueError, CryptoError) as exc:
        _fail(str(exc))
    try:
        found = fetch_status(target, ident, timeout)
    except AdminRefused as exc:
        _fail(str(exc))
    except AdminUnreachable as exc:
        _fail(str(exc), EXIT_FAILED)
    # It answered, so it runs (it may be finishing).
    return found, liveness(found, found.pid), found.elapsed_s


@pki_app.command("revoke")
def pki_revoke(name: str = typer.Argument(None, help="silo name: revokes every certificate "
                                                      "issued to it"),
               ca: Path = typer.Option(..., "--ca", help="the CA folder from `pki init`"),
               cert: Path = typer.Option(None, "--cert", help="revoke exactly this certificate "
                                                             "file"),
               serial: str = typer.Option(None, "--serial", help="revoke exactly this serial "
                                                                 "(hex, as `pki list` shows)")
               ) -> None:
    """Revoke a silo's certificate(s): re-signs <ca>/crl.pem, which a running coordinator
    picks up within a second."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import SERVER_NAME
    from trellis.crypto.revocation import certificate_serial, issued_certificates, revoke

    if sum(x is not None for x in (name, cert, serial)) != 1:
        _fail("name one silo, or give --cert FILE or --serial HEX (exactly one of them)")
    try:
        issued = issued_certificates(ca)
        if name is not None:
            if name == SERVER_NAME:
                _fail("the coordinator's own certificate is not checked against the CRL; "
                      "if its key is lost, create a new CA and re-issue the silos' certificates")
            chosen = {c.serial for c in issued if c.name == name}
            if not chosen:
                known = sorted({c.name for c in issued} - {SERVER_NAME})
                _fail(f"no certificate issued to {name!r} in {ca / 'issued'}; issued to: "
                      f"{', '.join(known) or 'nobody yet'}")
        elif cert is not None:
            chosen = {certificate_serial(_read_file(cert))}
        else:
            try:
                chosen = {int(serial.lower().removeprefix("0x"), 16)}
            except ValueError:
                _fail(f"--serial {serial!r}: expected a hexadecimal serial as `pki list` shows")
        unknown = chosen - {c.serial for c in issued}
        if unknown:
            _fail(f"serial {min(unknown):x} was not issued by the CA in {ca} (see `coordinator "
                  "pki list`)")
        crl = revoke(ca, chosen)
    except CryptoError as exc:
        _fail(str(exc))
    for c in issued:
        if c.serial in chosen:
            typer.echo(f"revoked {c.name} (serial {c.serial_hex}, expiring "
                       f"{c.not_after:%Y-%m-%d})")
    typer.echo(f"wrote {ca / 'crl.pem'} (number {crl.number}, {len(crl)} revoked in all); a "
               "running coordinator applies it within a second")


@pki_app.command("list")
def pki_list(ca: Path = typer.Option(..., "--ca", help="the CA folder from `pki init`"),
             as_json: bool = typer.Option(False, "--json", help="machine-readable list")
             ) -> None:
    """Show every certificate the CA issued, with its status and expiry."""
    from datetime import UTC, datetime

    from trellis.crypto.errors import CryptoError
    from trellis.crypto.revocation import issued_certificates, read_crl

    try:
        issued = issued_certificates(ca)
        crl = read_crl(ca)
    except CryptoError as exc:
        _fail(str(exc))
    now = datetime.now(UTC)
    rows = [{"name": c.name, "serial": c.serial_hex, "status": c.status(crl, now),
             "not_before": c.not_before.isoformat(), "not_after": c.not_after.isoformat()}
            for c in issued]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo(f"no issued certificates recorded in {ca / 'issued'}")
        return
    width = max(len(r["name"]) for r in rows)
    typer.echo(f"{'name':<{width}}  {'serial':<40}  {'expires':<10}  status")
    for c, r in zip(issued, rows, strict=True):
        typer.echo(f"{r['name']:<{width}}  {r['serial']:<40}  {c.not_after:%Y-%m-%d}  "
                   f"{r['status']}")


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")


@app.command()
def report(results: Path = typer.Option(..., "--results", help="folder of "
                                        "<setting>/<algorithm>/seed-N.json result files, or "
                                        "one results.json (also of a running federation)"),
           out: Path = typer.Option(Path("docs/results"), help="folder for the tables, "
                                    "summary.json and curves")) -> None:
    """Turn result files into the papers' tables (last and best-validation round), accuracy
    curves and summary.json."""
    from trellis.coordinator.operations.report import write_report

    if not results.exists():
        _fail(f"no such results folder or file: {results}")
    try:
        written = write_report(results, out)
    except (ValueError, KeyError) as exc:
        _fail(f"cannot build the report: {exc}")
    for path in written:
        typer.echo(f"wrote {path}")


_HEAD_HELP = ("Each log has a signed head beside it, <log>.head: the writer replaces it with "
              "every signed record (each round, and at close), so a log cut at its end no "
              "longer matches it. Archive the .head with the log. A log without its closing "
              "record fails, unless its writer still holds it open: then it is reported "
              "'open' (the writer is still running).")


def _verify(file: Path, cert: Path | None, head: Path | None = None) -> AuditReport:
    """Verify one log for the CLI: a missing or unreadable input is exit 2."""
    from trellis.crypto.audit import verify_audit_log
    from trellis.crypto.errors import CryptoError

    for given in (file, cert, head):
        if given is not None and not given.is_file():
            _fail(f"no such file: {given}")
    try:
        cert_pem = cert.read_bytes() if cert else None
        return verify_audit_log(file, cert_pem=cert_pem, head=head)
    except OSError as exc:
        _fail(f"cannot read {exc.filename}: {exc.strerror}")
    except CryptoError as exc:
        _fail(f"{exc}; give the certificate (.crt) of the log's writer")


def _report_json(report: AuditReport) -> dict[str, Any]:
    head = report.head
    return {"path": str(report.path), "ok": report.ok, "records": report.records,
            "checkpoints": report.checkpoints, "closed": report.closed, "open": report.open,
            "head": None if head is None else {"count": head.count, "ts": head.ts,
                                               "event": head.event,
                                               "path": str(report.head_file)},
            "problems": report.problems}


@audit_app.command("verify", help="Verify an audit log's hash chain, its signatures (given the "
                   "writer's certificate), its signed head and its ending. " + _HEAD_HELP)
def audit_verify(file: Path = typer.Argument(..., help="an audit.jsonl file"),
                 cert: Path = typer.Option(None, help="writer's certificate, to check the "
                                                      "signed checkpoints and head"),
                 head: Path = typer.Option(None, help="the signed head to measure the log "
                                                      "against (default: FILE.head if present)"),
                 as_json: bool = typer.Option(False, "--json", help="machine-readable report")
                 ) -> None:
    """Verify an audit log (see the command's help)."""
    from trellis.crypto.audit import format_report

    report = _verify(file, cert, head)
    if as_json:
        typer.echo(json.dumps(_report_json(report)))
    else:
        typer.echo(format_report(report))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


@audit_app.command("cross-check", help=(
    "Verify a silo's audit log and the coordinator's, then match every upload the silo says it "
    "sent with what the coordinator says it received, on (silo, round, attempt, kind): masked "
    "inputs, FedHGN sealed envelopes, the group-key seal and GCFL encrypted updates, whose "
    "payload both sides hash. Key adverts, sealed shares, survivor signatures, revealed shares "
    "and metrics are not hashed by the coordinator and are not compared. Every upload whose "
    "sha256 differs, or that one log lacks, is reported. An upload the coordinator refused is "
    "in neither log (it records an upload once accepted; the silo once the call returned). One "
    "legitimate asymmetry: an upload only in the coordinator's log, when the silo (or its "
    "connection) died after the coordinator accepted it and before the answer arrived; look "
    "for the silo's 'resumed' record. Only the silo's records of the coordinator log's "
    "federation are compared. Exit 0: consistent; 1: a discrepancy or a log that does not "
    "verify; 2: unreadable input. " + _HEAD_HELP))
def audit_cross_check(silo_log: Path = typer.Argument(..., help="the silo's audit.jsonl"),
                      coordinator_log: Path = typer.Argument(..., help="the coordinator's "
                                                                       "audit.jsonl"),
                      silo_cert: Path = typer.Option(None, help="the silo's certificate"),
                      coordinator_cert: Path = typer.Option(None, help="the coordinator's "
                                                                       "server certificate"),
                      as_json: bool = typer.Option(False, "--json",
                                                   help="machine-readable report")) -> None:
    """Cross-check a silo's audit log against the coordinator's (see the command's help)."""
    from trellis.crypto.audit import format_report
    from trellis.crypto.audit_crosscheck import cross_check, read_records
    from trellis.crypto.errors import AuditError

    reports = [_verify(silo_log, silo_cert), _verify(coordinator_log, coordinator_cert)]
    try:
        result = cross_check(read_records(silo_log), read_records(coordinator_log))
    except AuditError as exc:
        _fail(str(exc))
    ok = result.ok and all(r.ok for r in reports)
    if as_json:
        typer.echo(json.dumps({"ok": ok, "silo": result.silo, "matched": result.matched,
                               "silo_log": _report_json(reports[0]),
                               "coordinator_log": _report_json(reports[1]),
                               "problems": result.problems,
                               "discrepancies": [d.to_json() for d in result.discrepancies]}))
    else:
        for report in reports:
            typer.echo(format_report(report) + "\n")
        typer.echo(f"silo {result.silo}: {result.matched} uploads match the coordinator's log")
        for problem in result.problems:
            typer.echo(f"FAILED: {problem}")
        for discrepancy in result.discrepancies:
            typer.echo(f"MISMATCH: {discrepancy.describe()}")
        if ok:
            typer.echo("OK: both logs verify and agree on every upload")
        elif result.ok:
            typer.echo("FAILED: the uploads agree, but a log does not verify (see above)")
    if not ok:
        raise typer.Exit(EXIT_FAILED)


@audit_app.command("report")
def audit_report(state_dir: Path = typer.Option(..., "--state-dir",
                                                help="the coordinator's state_dir (audit.jsonl, "
                                                     "its .head, results.json)"),
                 ca: Path = typer.Option(None, "--ca", help="the CA folder: server.crt checks "
                                                            "the log's signatures, issued/ "
                                                            "names each silo's certificate"),
                 out: Path = typer.Option(..., "--out", help="report.md or report.html"),
                 fmt: str = typer.Option(None, "--format",
                                         help="md | html (default: from --out's suffix)")
                 ) -> None:
    """Write the compliance report: admitted identities and their certificates, rounds with
    participants, dropouts and aborted attempts, refusals, revocation-list changes, and whether
    the audit log verifies (exit 1 if it does not)."""
    from datetime import UTC, datetime

    from trellis.coordinator.operations.compliance import AUDIT_LOG, report_state_dir
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import SERVER_CERT
    from trellis.protos.document import format_for, render
    from trellis.protos.files import write_atomic

    try:
        chosen = format_for(out, fmt)
    except ValueError as exc:
        _fail(str(exc))
    if not (state_dir / AUDIT_LOG).is_file():
        _fail(f"no audit log {state_dir / AUDIT_LOG}: give the plan's server.state_dir")
    if ca is not None and not (ca / SERVER_CERT).is_file():
        _fail(f"--ca {ca}: no {SERVER_CERT} there; give the CA folder from `pki init`")
    now = datetime.now(UTC)
    try:
        document, verification = report_state_dir(
            state_dir, ca, generated=now.strftime("%Y-%m-%d %H:%M:%S UTC"), now=now)
        text = render(document, chosen).encode()
        write_atomic(out, lambda handle: handle.write(text))
    except CryptoError as exc:
        _fail(str(exc))
    except ValueError as exc:          # results.json that is not JSON
        _fail(f"{state_dir / 'results.json'}: {exc}")
    except OSError as exc:
        _fail(f"cannot read or write {exc.filename}: {exc.strerror}")
    if not verification.ok:
        _fail(f"wrote {out}, but the audit log does NOT verify: {verification.problems[0]} "
              f"({len(verification.problems)} problem(s), all listed in the report)",
              EXIT_FAILED)
    typer.echo(f"wrote {out}: the audit log verifies ({verification.records} records)")


def main() -> None:
    """Entry point of the `coordinator` command and of `python -m trellis.coordinator.cli`."""
    from trellis.protos.stop import run_command

    run_command(app)


if __name__ == "__main__":
    main()
