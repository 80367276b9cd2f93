"""Does a dataset folder meet a plan's ``[data] reference_sha256``? The check `silo join` and a
standing silo's job approval make before anything is sent.

Light on purpose: it reads the manifest's JSON and nothing else, so ``silo/jobs`` can use it
without loading torch or RDKit.
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST = "manifest.json"


class DatasetMismatch(Exception):
    """The silo's dataset was prepared otherwise than the plan requires: a mistake retrying
    cannot fix, so `silo join` leaves before sending anything and exits 2."""


def dataset_fingerprint(folder: Path) -> str:
    """The fingerprint a prepared folder's manifest records; "" for a folder without one (a TU
    or heterogeneous folder, a non-molecule preparation, an unreadable manifest)."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    value = manifest.get("fingerprint", "") if isinstance(manifest, dict) else ""
    return value if isinstance(value, str) else ""


def reference_problem(required: str, have: str, dataset: str) -> str:
    """Why a dataset whose fingerprint is `have` cannot serve a plan requiring `required`
    ("" when it can: the plan requires none, or the two are equal)."""
    if not required or have == required:
        return ""
    if not have:
        return (f"the plan requires a prepared dataset with the reference-set fingerprint "
                f"{required} ([data] reference_sha256), and {dataset} records none (a TU "
                "folder, or prepared without a molecule featuriser): prepare it with "
                "`silo data prepare` as the federation says")
    return (f"the plan requires the reference-set fingerprint {required} ([data] "
            f"reference_sha256), and {dataset} was prepared with {have}: its preparation "
            "differs from the federation's; `silo data fingerprint` prints each setting's hash, "
            "prepare it again with the one the plan names")
