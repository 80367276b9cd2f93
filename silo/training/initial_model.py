"""A public initial model on the silo's disk: its file format, its check against the plan, and
the start a trainer takes from it (the plan's [model] init_sha256, docs/configuration.md).

The file is a torch file of plain data, read with ``weights_only=True`` (no code is unpickled):
``{"format": FORMAT, "version": 1, "header": <JSON text>, "parameters": {name: tensor}}``. The
header says what the file is: the algorithm and model settings it was built for, the public
data it was pretrained on, the library versions. The plan names the file by the SHA-256 of its
bytes; a silo checks that hash before anything is sent (`initial_problem`).

A trainer starts from it group by group (a group: a top-level module, as the algorithm's row
names them): every shared group must be in the file with the model's exact shapes, so every
silo starts its shared groups alike; a local group is taken where the file holds all of it with
the model's shapes (a feature or class count of another dataset keeps the seeded start).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trellis.protos.files import write_atomic
from trellis.protos.plan import PublicPlan

FORMAT = "trellis-initial-model"
FORMAT_VERSION = 1


class InitialModelMismatch(Exception):
    """The silo's initial model cannot serve the plan (another hash, none, not a model file,
    other shapes): a mistake retrying cannot fix, so `silo join` leaves before sending anything
    and exits 2."""


@dataclass(frozen=True)
class InitialModel:
    """A read initial model file: its hash, its header and its parameter tensors."""

    path: Path
    sha256: str
    header: Mapping[str, Any]
    parameters: Mapping[str, torch.Tensor]


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_initial_model(path: Path, parameters: Mapping[str, torch.Tensor],
                        header: Mapping[str, Any]) -> str:
    """Write an initial model file atomically; returns its SHA-256 (what a plan names)."""
    import io

    doc = {"format": FORMAT, "version": FORMAT_VERSION,
           "header": json.dumps(dict(header), sort_keys=True),
           "parameters": {n: t.detach().cpu().contiguous().clone()
                          for n, t in sorted(parameters.items())}}
    buffer = io.BytesIO()
    torch.save(doc, buffer)
    blob = buffer.getvalue()
    write_atomic(Path(path), lambda handle: handle.write(blob))
    return hashlib.sha256(blob).hexdigest()


def read_initial_model(path: Path) -> InitialModel:
    """Read and check an initial model file (InitialModelMismatch saying what is wrong)."""
    path = Path(path)
    try:
        sha256 = file_sha256(path)
    except OSError as exc:
        raise InitialModelMismatch(f"cannot read the initial model {path}: "
                                   f"{exc.strerror}") from None
    try:
        doc = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a foreign file
        raise InitialModelMismatch(f"{path} (sha256 {sha256}) is not an initial model file "
                                   f"({type(exc).__name__}); build one with "
                                   "bench/pretrain_public.py") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InitialModelMismatch(f"{path} (sha256 {sha256}) is not an initial model file "
                                   f"(no {FORMAT!r} format mark); build one with "
                                   "bench/pretrain_public.py")
    if doc.get("version") != FORMAT_VERSION:
        raise InitialModelMismatch(f"{path} is an initial model of format version "
                                   f"{doc.get('version')!r}; this silo reads {FORMAT_VERSION}")
    parameters, header = doc.get("parameters"), doc.get("header")
    try:
        header = json.loads(header) if isinstance(header, str) else None
    except ValueError:
        header = None
    if (not isinstance(parameters, dict) or not isinstance(header, dict)
            or not all(isinstance(n, str) and isinstance(t, torch.Tensor)
                       and t.is_floating_point() for n, t in parameters.items())):
        raise InitialModelMismatch(f"{path} (sha256 {sha256}) is damaged: it must hold a JSON "
                                   "header and floating-point tensors by name")
    bad = [n for n, t in parameters.items() if not bool(torch.isfinite(t).all())]
    if bad:
        raise InitialModelMismatch(f"{path} (sha256 {sha256}) holds NaN or infinite values "
                                   f"in {', '.join(sorted(bad)[:3])}")
    return InitialModel(path, sha256, header, parameters)


def initial_problem(plan: PublicPlan, have: str | None) -> str:
    """Why a silo whose initial model file has SHA-256 `have` (None: it was given none) cannot
    start the plan ("" when it can)."""
    required = plan.model.init_sha256
    if not required:
        if have is None:
            return ""
        return (f"this silo was given an initial model (sha256 {have}) but the plan of "
                f"federation {plan.federation} names none ([model] init_sha256): it starts "
                "from the plan's seed; join without --init-model")
    if have is None:
        return (f"the plan of federation {plan.federation} starts from the public initial "
                f"model {required} ([model] init_sha256), and this silo was given none: pass "
                "the file with --init-model")
    if have != required:
        return (f"the plan of federation {plan.federation} starts from the initial model "
                f"{required} ([model] init_sha256), and this silo's file has {have}: ask the "
                "coordinator operator for the file the plan names")
    return ""


def start_from(model: nn.Module, initial: InitialModel, shared_groups: Iterable[str]
               ) -> tuple[str, ...]:
    """Copy the file's groups into the model; returns the groups taken, sorted. Every shared
    group must be there with the model's shapes (InitialModelMismatch otherwise)."""
    shared = set(shared_groups)
    params = dict(model.named_parameters())
    groups: dict[str, list[str]] = {}
    for name in params:
        groups.setdefault(_group(name), []).append(name)
    taken: list[str] = []
    for group, names in sorted(groups.items()):
        problem = _group_problem(names, params, initial.parameters)
        if problem and group in shared:
            raise InitialModelMismatch(f"the initial model {initial.path} (sha256 "
                                       f"{initial.sha256}) cannot start the shared group "
                                       f"{group!r}: {problem}")
        if not problem:
            taken.append(group)
    with torch.no_grad():
        for group in taken:
            for name in groups[group]:
                params[name].copy_(initial.parameters[name].to(params[name].dtype))
    return tuple(taken)


def freeze(model: nn.Module, groups: Iterable[str]) -> None:
    """Mark every parameter of the named groups as not trained (requires_grad=False)."""
    frozen = set(groups)
    for name, param in model.named_parameters():
        if _group(name) in frozen:
            param.requires_grad_(False)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimiser may change: those not frozen."""
    return [p for p in model.parameters() if p.requires_grad]


def model_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter tensor by name (what an initial model file holds)."""
    return {n: p.detach() for n, p in model.named_parameters()}


def _group(name: str) -> str:
    return name.split(".", 1)[0]


def _group_problem(names: list[str], params: Mapping[str, torch.Tensor],
                   held: Mapping[str, torch.Tensor]) -> str:
    """Why the file cannot start this group ("" when it can)."""
    missing = [n for n in names if n not in held]
    if missing:
        return f"the file holds no {missing[0]}"
    for name in names:
        if tuple(held[name].shape) != tuple(params[name].shape):
            return (f"{name} has shape {tuple(held[name].shape)} in the file and "
                    f"{tuple(params[name].shape)} in the plan's model (another [model] "
                    "hidden, layers, n_rw or n_dg?)")
    return ""
