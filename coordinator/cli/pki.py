"""``coordinator pki``: the federation's certificate authority, its certificates and revocations."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from trellis.coordinator.cli.common import fail

if TYPE_CHECKING:
    from trellis.coordinator.pki.onboarding import Address
    from trellis.crypto.revocation import IssuedCertificate
    from trellis.protos.plan import PublicPlan

pki_app = typer.Typer(help="Federation certificate authority.", no_args_is_help=True)


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
        fail(str(exc))
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
                                                            "template from this plan (a job "
                                                            "plan or a one-plan plan)"),
             renew: bool = typer.Option(False, "--renew", help="replace the silo's valid "
                                                               "certificate: revoke it once the "
                                                               "new one is issued")) -> None:
    """Issue a silo certificate from its CSR (the silo's private key never comes here).

    One valid certificate per name: a name that already has one is refused unless --renew."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.issuance import sign_silo_request
    from trellis.crypto.pki import SERVER_CERT

    kit_plan = None
    if kit is None:
        if coordinator_address is not None or plan is not None:
            fail("--coordinator-address and --plan go with --kit FOLDER")
    else:
        kit_plan = _kit_checks(kit, coordinator_address, plan, ca / SERVER_CERT)
    try:
        issued = sign_silo_request(csr, ca, days=days, out_dir=out, renew=renew)
    except CryptoError as exc:
        fail(str(exc))
    cert = issued.cert
    typer.echo(f"issued {cert}; return it and {cert.parent / 'ca.crt'} to the silo operator")
    _echo_replaced(issued.replaced, ca)
    if kit is not None and kit_plan is not None:
        from trellis.coordinator.pki.onboarding import KitError, build_kit

        address, public, admitted = kit_plan
        try:
            tarball = build_kit(kit, cert=cert, ca_cert=cert.parent / "ca.crt", address=address,
                                plan=public)
        except KitError as exc:
            fail(f"{exc} (the certificate {cert} was issued)")
        typer.echo(f"wrote onboarding kit {kit} and {tarball}; send the tarball to the silo "
                   "operator (it holds no private key)")
        name = cert.stem
        if admitted is not None and name not in admitted:
            typer.echo(f"note: {name} is not in federation.silos of {plan}; add it there "
                       "(and, for a standing coordinator, to its deployment's silos) before "
                       "the plan runs, or the silo is refused")


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
        fail("--kit needs --coordinator-address host:port (where the silo dials the "
             "coordinator)")
    try:
        parsed = parse_address(address)
        check_empty_folder(kit)
        if server_cert.exists():
            check_address_in_certificate(parsed, server_cert.read_bytes())
    except KitError as exc:
        fail(str(exc))
    if plan is None:
        return parsed, None, None
    try:
        loaded = load_plan(plan)
    except PlanError as exc:
        fail(f"--plan {plan}: " + "; ".join(exc.problems))
    return parsed, loaded.public, loaded.silos


@pki_app.command("operator")
def pki_operator(name: str = typer.Option(..., "--name", help="the operator's name"),
                 ca: Path = typer.Option(..., "--ca", help="the CA folder from `pki init`"),
                 out: Path = typer.Option(..., "--out", help="folder for the key, certificate "
                                                            "and ca.crt (created)"),
                 days: int = typer.Option(365, help="validity in days"),
                 renew: bool = typer.Option(False, "--renew", help="replace the operator's "
                                                                   "valid certificate: revoke "
                                                                   "it once the new one is "
                                                                   "issued")) -> None:
    """Issue an operator's key and certificate: it submits and follows jobs (`coordinator
    jobs`) and asks for status (`coordinator status`); it opens nothing of a federation itself."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.issuance import issue_operator_identity

    try:
        issued = issue_operator_identity(ca, name, out, days=days, renew=renew)
    except CryptoError as exc:
        fail(str(exc))
    cert = issued.cert
    typer.echo(f"issued operator certificate {cert} (key {cert.with_suffix('.key')}, "
               f"{cert.parent / 'ca.crt'}); use it with `coordinator jobs ... --coordinator "
               f"HOST:PORT --identity {out}` (and `coordinator status`)")
    _echo_replaced(issued.replaced, ca)


def _echo_replaced(replaced: Sequence[IssuedCertificate], ca: Path) -> None:
    """Say which certificates a renewal revoked (a running coordinator drops them)."""
    for old in replaced:
        typer.echo(f"revoked the certificate it replaces: {old.name} (serial {old.serial_hex}); "
                   f"{ca / 'crl.pem'} re-signed, a running coordinator applies it within a "
                   "second")


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
        fail("name one silo, or give --cert FILE or --serial HEX (exactly one of them)")
    try:
        issued = issued_certificates(ca)
        if name is not None:
            if name == SERVER_NAME:
                fail("the coordinator's own certificate is not checked against the CRL; "
                     "if its key is lost, create a new CA and re-issue the silos' certificates")
            chosen = {c.serial for c in issued if c.name == name}
            if not chosen:
                known = sorted({c.name for c in issued} - {SERVER_NAME})
                fail(f"no certificate issued to {name!r} in {ca / 'issued'}; issued to: "
                     f"{', '.join(known) or 'nobody yet'}")
        elif cert is not None:
            chosen = {certificate_serial(_read_file(cert))}
        else:
            try:
                chosen = {int(serial.lower().removeprefix("0x"), 16)}
            except ValueError:
                fail(f"--serial {serial!r}: expected a hexadecimal serial as `pki list` shows")
        unknown = chosen - {c.serial for c in issued}
        if unknown:
            fail(f"serial {min(unknown):x} was not issued by the CA in {ca} (see `coordinator "
                 "pki list`)")
        crl = revoke(ca, chosen)
    except CryptoError as exc:
        fail(str(exc))
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
        fail(str(exc))
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
        fail(f"cannot read {path}: {exc.strerror}")

