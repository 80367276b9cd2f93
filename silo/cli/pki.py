"""`silo pki`: this silo's identity -- its key, and the certificate requests for the coordinator."""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.silo.cli.exits import fail

app = typer.Typer(help="This silo's identity.", no_args_is_help=True)


@app.command("request")
def pki_request(name: str = typer.Option(..., "--name", help="this silo's name, as admitted "
                                                             "in the plan"),
                dir: Path = typer.Option(Path("id"), "--dir", help="identity folder")) -> None:
    """Create this silo's private key (kept here) and a CSR for the coordinator operator."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import request_identity

    try:
        csr = request_identity(name, dir)
    except CryptoError as exc:
        fail(str(exc))
    typer.echo(f"wrote {dir / (name + '.key')} (private, mode 0600) and {csr}; send the .csr "
               "to the coordinator operator")


@app.command("renew")
def pki_renew(dir: Path = typer.Option(Path("id"), "--dir", help="identity folder")) -> None:
    """Re-key this silo: retire its key and certificate, make a new key and CSR (same name)."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import renew_identity

    try:
        csr, retired = renew_identity(dir)
    except CryptoError as exc:
        fail(str(exc))
    serial = retired.name.rpartition("-")[2]
    typer.echo(f"moved the old key and certificate to {retired}; wrote a new key and {csr}. "
               "Send the .csr to the coordinator operator to sign as a renewal, which revokes "
               f"the old certificate (serial {serial}): coordinator pki sign {csr.name} "
               "--ca CA_DIR --renew")
