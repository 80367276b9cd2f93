"""`silo data prepare|inspect|fingerprint`: a site's own data made into a prepared folder.

`prepare` reads one source (SMILES, SDF, OGB, PyG, NetworkX, edge lists, TU, RDF) into the
documented folder `silo join` and `silo serve` read (docs/data/format.md), listing every input
row it refused; `inspect` shows what the federation will see of a prepared folder; and
`fingerprint` prints the hash of the shipped reference molecules under a featuriser, which a
plan may require (`[data] reference_sha256`). Every mistake is one line and exit 2, and a
preparation that fails or is stopped leaves nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from trellis.silo.cli.exits import fail

app = typer.Typer(help="Prepare a site's own graphs for the federation, inspect them, and "
                       "fingerprint the preparation.", no_args_is_help=True)

# Refusals listed on stderr before "... and N more"; all are in the manifest.
SHOWN_REFUSALS = 20


@app.command("prepare")
def prepare(
    source: Path = typer.Argument(..., help="the input: a file or folder of graphs"),
    out: Path = typer.Option(..., "--out", help="the prepared folder to write (new or empty)"),
    fmt: str = typer.Option("", "--format", help="tu | smiles | sdf | ogb | pyg | networkx | "
                            "edgelist | rdf (default: from the folder's layout or the file's "
                            "extension)"),
    smiles_column: str = typer.Option("smiles", help="SMILES table: the column of SMILES"),
    label_column: str = typer.Option("label", help="the column holding each graph's label"),
    id_column: str = typer.Option("", help="the column naming each row (in messages)"),
    separator: str = typer.Option("", help="table separator (default: ',' for .csv, tab for "
                                  ".tsv/.tab/.txt)"),
    label_property: str = typer.Option("", help="SDF: the property holding the label"),
    labels: Path = typer.Option(None, help="a separate CSV of labels (id,label or row order)"),
    standardise: bool = typer.Option(False, "--standardise", help="molecules: strip salts and "
                                     "neutralise charges"),
    scaffold_split: bool = typer.Option(False, "--scaffold-split", help="molecules: Bemis-Murcko "
                                        "scaffold split 80/10/10, kept in the folder"),
    node_labels: Path = typer.Option(None, help="edge list: the node label file"),
    graph_labels: Path = typer.Option(None, help="edge list: the graph label file"),
    graph_indicator: Path = typer.Option(None, help="edge list: the node -> graph file"),
    entity_class: str = typer.Option("", help="RDF: the class (URI) of the entities to "
                                     "classify"),
    label_predicate: str = typer.Option("", help="RDF: the predicate (URI) of their label"),
    classes: str = typer.Option("", help="RDF: the label values, comma-separated, in class-index "
                                "order, the same at every site (default: the values found, "
                                "sorted); an entity with another label is a refused row"),
    name: str = typer.Option("", help="dataset name (default: the source's name)"),
    strict: bool = typer.Option(False, "--strict/--keep-going", help="--strict: any refused row "
                                "stops the preparation and nothing is written; --keep-going: "
                                "refused rows are listed and kept in the manifest"),
) -> None:
    """Prepare a source into a folder `silo join --data` and `silo serve --data` read."""
    from trellis.protos.stop import describe, exit_code, stop_on_sigterm
    from trellis.silo.data.prepared.folder import RowsRefused, refuse_existing
    from trellis.silo.data.prepared.model import SourceOptions
    from trellis.silo.data.prepared.registry import detect_format, missing_package

    stop_on_sigterm()       # a stop unwinds like Ctrl-C, so the half-written folder is removed
    options = SourceOptions(
        format=fmt, smiles_column=smiles_column, label_column=label_column, id_column=id_column,
        separator=separator, label_property=label_property, labels=labels,
        standardise=standardise, scaffold_split=scaffold_split, node_labels=node_labels,
        graph_labels=graph_labels, graph_indicator=graph_indicator, entity_class=entity_class,
        label_predicate=label_predicate, name=name,
        classes=tuple(c.strip() for c in classes.split(",") if c.strip()))
    try:
        if not source.exists():
            fail(f"{source}: no such file or folder")
        refuse_existing(out)
        chosen = fmt or detect_format(source)
        try:
            summary = _prepare(chosen, source, options, out, strict)
        except ModuleNotFoundError as exc:      # a reader's lazy import of RDKit or rdflib
            raise missing_package(exc, f"format {chosen}") from None
    except RowsRefused as exc:
        _list_refusals(exc.refused, everything_in_manifest=False)
        fail(str(exc))
    except (ValueError, OSError) as exc:          # DataFormatError, HeteroFormatError
        fail(str(exc))
    except KeyboardInterrupt as stop:
        fail(f"{describe(stop)}: nothing written to {out}", exit_code(stop))
    typer.echo(summary)


def _prepare(fmt: str, source: Path, options: Any, out: Path, strict: bool) -> str:
    """Read the source, write the folder, list the refusals; return the summary line."""
    from trellis.silo.data.prepared.folder import write_prepared, write_prepared_hetero
    from trellis.silo.data.prepared.registry import (
        HETERO_FORMATS,
        MOLECULE_FORMATS,
        SourceUnavailable,
        reader,
        reference_fingerprint,
    )

    read = reader(fmt)
    dataset_name = options.name or source.stem
    if fmt in HETERO_FORMATS:
        from trellis.silo.data.rdf.read import convert_rdf

        done = convert_rdf(source, options)
        graph, refused = done.graph, done.refused
        write_prepared_hetero(graph, refused, done.featuriser, done.sources, out,
                              name=dataset_name, strict=strict, notes=done.notes,
                              meta={"dataset": dataset_name, "classes": done.classes})
        _list_refusals(refused)
        return (f"wrote a heterogeneous graph ({graph.total_nodes} nodes, "
                f"{graph.target_type} labelled) to {out}; {len(refused)} row(s) refused")
    prep = read(source, options)
    prep.name = prep.name or dataset_name
    fingerprint = ""
    if fmt in MOLECULE_FORMATS:
        try:
            fingerprint = reference_fingerprint(prep.featuriser)
        except SourceUnavailable:
            fingerprint = ""        # a version without the reference set: nothing to record
    if not prep.graphs:
        # Nothing will be written (write_prepared says so): first say why each row was refused.
        _list_refusals(prep.refused, everything_in_manifest=False)
    write_prepared(prep, out, strict=strict, fingerprint=fingerprint)
    _list_refusals(prep.refused)
    classes: dict[int, int] = {}
    for graph in prep.graphs:
        classes[graph.label] = classes.get(graph.label, 0) + 1
    per_class = ", ".join(f"label {label}: {n}" for label, n in sorted(classes.items()))
    return (f"wrote {len(prep.graphs)} graphs ({per_class}) to {out}; "
            f"{len(prep.refused)} row(s) refused")


def _list_refusals(refused: Sequence[Any], everything_in_manifest: bool = True) -> None:
    """The refused rows as warnings on stderr, the first SHOWN_REFUSALS of them."""
    for refusal in refused[:SHOWN_REFUSALS]:
        typer.echo(f"warning: {refusal.source}: row {refusal.row}: {refusal.reason}", err=True)
    if len(refused) > SHOWN_REFUSALS:
        where = ", all in manifest.json" if everything_in_manifest else ""
        typer.echo(f"warning: ... and {len(refused) - SHOWN_REFUSALS} more{where}", err=True)


@app.command("inspect")
def inspect(folder: Path = typer.Argument(..., help="a prepared folder"),
            as_json: bool = typer.Option(False, "--json", help="print the report as JSON")
            ) -> None:
    """Show what the federation will see of a prepared folder; exit 2 if it cannot be used."""
    from trellis.silo.data.prepared.inspect import inspect_prepared

    try:
        report = inspect_prepared(folder)
    except ValueError as exc:         # DataFormatError, HeteroFormatError
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=1))
    else:
        for line in _report_lines(report):
            typer.echo(line)
    if report.problems:
        for problem in report.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)


def _report_lines(report: Any) -> list[str]:
    """The human-readable report of `silo data inspect`."""
    featuriser = report.featuriser
    lines = [f"{report.name}: {report.folder}",
             f"  featuriser:    {featuriser.get('name')} version {featuriser.get('version')} "
             f"{json.dumps(featuriser.get('settings', {}), sort_keys=True)}",
             f"  fingerprint:   {report.fingerprint or '(none)'}",
             f"  graphs:        {report.graphs}" + (" (one heterogeneous graph)"
                                                    if report.task == "node" else ""),
             "  classes:       " + ", ".join(f"label {c}: {n}" for c, n in report.classes.items()),
             "  split:         " + ", ".join(f"{n} {p}" for p, n in report.split.items())
             + f" ({report.split_kind})",
             f"  features:      {report.node_features} per node, {report.edge_features} per edge",
             f"  nodes:         {_spread(report.nodes)}",
             f"  edges:         {_spread(report.edges)} (each direction counted)"]
    if report.task == "graph":
        dup = f"  duplicates:    {report.duplicates} graph(s) repeat an earlier one"
        if report.conflicting_duplicates:
            dup += f" ({report.conflicting_duplicates} group(s) with different labels)"
        lines.append(dup)
        lines += [f"    same graph:  {' = '.join(group)}" for group in report.duplicate_groups]
    lines.append(f"  refused rows:  {len(report.refused)}"
                 + (" (all in manifest.json)" if report.refused else ""))
    lines += [f"    {r['source']}: row {r['row']}: {r['reason']}"
              for r in report.refused[:SHOWN_REFUSALS]]
    if len(report.refused) > SHOWN_REFUSALS:
        lines.append(f"    ... and {len(report.refused) - SHOWN_REFUSALS} more")
    return lines


def _spread(values: dict[str, Any]) -> str:
    if not values:
        return "-"
    return f"min {values.get('min')}, mean {values.get('mean')}, max {values.get('max')}"


@app.command("fingerprint")
def fingerprint(standardise: bool = typer.Option(False, "--standardise", help="with "
                                                 "standardisation, as `prepare --standardise`"),
                as_json: bool = typer.Option(False, "--json", help="print it as JSON")) -> None:
    """Print the reference-set fingerprint of the molecule preparation (a plan names it as
    data.reference_sha256)."""
    from trellis.silo.data.prepared.registry import (
        missing_package,
        molecule_featuriser,
        reference_fingerprint,
    )

    try:
        featuriser = molecule_featuriser(standardise=standardise)
        digest = reference_fingerprint(featuriser)
    except ModuleNotFoundError as exc:      # RDKit, imported lazily
        fail(str(missing_package(exc, "the reference-set fingerprint")))
    except ValueError as exc:               # SourceUnavailable, DataFormatError
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps({"fingerprint": digest,
                               "featuriser": {"name": featuriser.name,
                                              "version": featuriser.version,
                                              "settings": featuriser.settings}}, indent=1))
    else:
        typer.echo(f"{digest}  {featuriser.name} version {featuriser.version} "
                   f"{json.dumps(featuriser.settings, sort_keys=True)}")
