"""The data-preparation commands: make demo data, cut one dataset or graph into silos."""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.silo.cli.exits import fail


def make_demo_data(out: Path = typer.Option(..., "--out", help="folder to write (TU format)"),
                   domain: str = typer.Option(..., help="molecules | social | bio"),
                   graphs: int = typer.Option(300, help="number of graphs"),
                   seed: int = typer.Option(0, help="generator seed"),
                   name: str = typer.Option(None, help="dataset name (default: domain)")) -> None:
    """Write a synthetic graph-classification dataset (no download needed)."""
    from trellis.silo.data.synthetic import DOMAINS, write_tu_folder

    if domain not in DOMAINS:
        fail(f"--domain {domain!r}: valid choices: {', '.join(DOMAINS)}")
    folder = write_tu_folder(out, name or domain.upper(), domain, graphs, seed=seed)
    typer.echo(f"wrote {graphs} {domain} graphs to {folder}")


def split_hetero(source: Path = typer.Option(..., "--input",
                                             help="heterogeneous graph folder to cut"),
                 method: str = typer.Option(..., help="random-edges | random-etypes"),
                 clients: int = typer.Option(..., help="number of silo graphs K (at least 3)"),
                 out: Path = typer.Option(..., "--out", help="folder for client-0..K-1"),
                 seed: int = typer.Option(12345, help="shuffle seed")) -> None:
    """Cut one heterogeneous graph into K silo graphs as the FedHGN paper did."""
    from trellis.silo.data.hetero import HeteroFormatError, load_hetero_folder
    from trellis.silo.data.hetero_split import METHODS, write_split

    if method not in METHODS:
        fail(f"--method {method!r}: valid choices: {', '.join(METHODS)}")
    if clients < 3:
        fail("--clients must be at least 3 (each shared edge goes to 2..K-1 silos)")
    if out.exists() and any(out.iterdir()):
        fail(f"--out {out} is not empty")
    try:
        write_split(load_hetero_folder(source), method, clients, seed, out)
    except HeteroFormatError as exc:
        fail(str(exc))
    typer.echo(f"wrote {clients} silo graphs ({method}) to {out}")


def split_tu(source: Path = typer.Option(..., "--input", help="TU dataset folder to cut"),
             clients: int = typer.Option(..., help="number of silo datasets K (at least 2)"),
             out: Path = typer.Option(..., "--out", help="folder for client-0..K-1"),
             seed: int = typer.Option(123, help="seed of the reference's random assignment")
             ) -> None:
    """Cut one TU dataset into K silo datasets as GCFL's oneDS experiments did."""
    from trellis.silo.data.tu_split import write_oneds_split

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        fail(f"--out {out} is not an empty folder")
    try:
        folders = write_oneds_split(source, clients, out, seed)
    except ValueError as exc:       # DataFormatError included
        fail(str(exc))
    sizes = ", ".join(str(n) for n in folders.values())
    typer.echo(f"wrote {clients} silo datasets to {out} (graphs per silo: {sizes})")
