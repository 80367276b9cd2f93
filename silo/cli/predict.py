"""`silo predict`: apply this silo's final model to graphs, offline."""

from __future__ import annotations

from pathlib import Path

import typer

from trellis.silo.cli.exits import fail
from trellis.silo.cli.threads import configure_threads


def predict(model: Path = typer.Option(..., "--model", help="a silo's final_model.pt"),
            data: Path = typer.Option(..., "--data", help="TU or prepared folder of graphs to "
                                                          "classify, as the model's training "
                                                          "data was (FedHGN: the silo's graph "
                                                          "folder)"),
            out: Path = typer.Option(..., "--out", help="CSV file to write"),
            threads: int = typer.Option(None, help="torch threads (default: all cores)")
            ) -> None:
    """Apply this silo's final model to graphs, offline: one CSV row per graph (or node)."""
    configure_threads(threads)
    from trellis.silo.training.predict import (
        PredictError,
        predict_folder,
        read_final_model,
        write_predictions,
    )

    try:
        final = read_final_model(model)
        found = predict_folder(final, data)
        write_predictions(found, out)
    except PredictError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"--out {out}: cannot write ({exc.strerror})")
    label = final.label
    accuracy = found.accuracy
    typer.echo(f"predicted {len(found.predicted)} {found.id_column}s with {label.get('silo')}'s "
               f"final model ({label.get('algorithm')}, federation {label.get('federation')}, "
               f"round {label.get('round')})"
               + (f"; accuracy {accuracy:.4f} against the folder's labels"
                  if accuracy is not None else "") + f"; wrote {out}")
