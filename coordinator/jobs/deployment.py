"""The standing coordinator's deployment file: TOML -> typed, validated ``DeploymentConfig``.

A deployment says what stays the same from job to job: the consortium's name, the silos it
admits, the operators who may submit jobs, how many jobs run at once, how long silos have to
answer an offer, and the coordinator's [server] (where it listens, its certificates, where it
keeps state). Job plans carry none of this (coordinator/jobs/job_plan.py). Every problem is
reported at once with its dotted path, as protos/plan.py does for a plan; relative paths are
resolved against the deployment file's folder.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trellis.protos.fields import (
    check_keys,
    read_float,
    read_int,
    read_path,
    read_table,
    shown,
    valid_address,
    valid_name,
)
from trellis.protos.plan import ServerConfig
from trellis.protos.user_text import NotText, decode_user_text

MAX_CONCURRENT_JOBS = 64
DEFAULT_APPROVAL_DEADLINE_S = 3600.0
NAME_RULE = "letters, digits, '.', '_', '-', starting with a letter or digit, at most 64"


class DeploymentError(ValueError):
    """A deployment file has one or more invalid fields; `problems` lists them as
    'path: message'."""

    def __init__(self, problems: list[str], source: str = "deployment") -> None:
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


@dataclass(frozen=True)
class DeploymentConfig:
    """A whole, validated deployment: the consortium and its coordinator's server."""

    name: str
    silos: tuple[str, ...]
    operators: tuple[str, ...]      # empty: any operator certificate of the CA may submit
    max_concurrent_jobs: int
    approval_deadline_s: float
    listen: str
    ca_cert: Path
    server_cert: Path
    server_key: Path
    crl: Path | None
    state_root: Path
    upload_memory_mb: int
    stream_window_kb: int
    health_listen: str | None
    metrics_listen: str | None
    source: Path | None = None

    def server_config(self, state_dir: Path) -> ServerConfig:
        """The [server] of one job's Plan: this deployment's, with that job's state folder."""
        return ServerConfig(listen=self.listen, ca_cert=self.ca_cert,
                            server_cert=self.server_cert, server_key=self.server_key,
                            state_dir=state_dir, crl=self.crl,
                            upload_memory_mb=self.upload_memory_mb,
                            stream_window_kb=self.stream_window_kb)

    def job_folder(self, job_id: int) -> Path:
        """Where one job keeps its checkpoint, audit log and results."""
        return self.state_root / "jobs" / f"{job_id}"

    def admits_operator(self, subject: str) -> bool:
        """Whether an operator certificate with this subject may submit jobs."""
        return not self.operators or subject in self.operators


def load_deployment(path: Path) -> DeploymentConfig:
    """Read and validate a deployment file."""
    try:
        text = decode_user_text(path.read_bytes())
    except OSError as exc:
        raise DeploymentError([f"cannot read deployment file: {exc.strerror}"],
                              str(path)) from None
    except NotText as exc:
        raise DeploymentError([str(exc)], str(path)) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeploymentError([f"not valid TOML: {exc}"], str(path)) from None
    return parse_deployment(raw, base_dir=path.resolve().parent, source=path)


def parse_deployment(raw: dict[str, Any], *, base_dir: Path,
                     source: Path | None = None) -> DeploymentConfig:
    """Validate a parsed TOML document into a DeploymentConfig, collecting every problem."""
    problems: list[str] = []
    check_keys(raw, "", {"deployment", "server"}, problems)
    dep = read_table(raw, "deployment", problems)
    check_keys(dep, "deployment", {"name", "silos", "operators", "max_concurrent_jobs",
                                   "approval_deadline_s"}, problems)
    name = dep.get("name")
    if name is None:
        problems.append("deployment.name: required")
    elif not valid_name(name):
        problems.append(f"deployment.name: {NAME_RULE} (got {shown(name)})")
    silos = _names(dep, "silos", "silo", problems, required=True)
    operators = _names(dep, "operators", "operator", problems, required=False)
    max_jobs = read_int(dep, "max_concurrent_jobs", "deployment.max_concurrent_jobs", problems,
                        default=1, low=1, high=MAX_CONCURRENT_JOBS)
    deadline = read_float(dep, "approval_deadline_s", "deployment.approval_deadline_s",
                          problems, DEFAULT_APPROVAL_DEADLINE_S)
    if deadline <= 0:
        problems.append(f"deployment.approval_deadline_s: must be > 0, got {deadline}")

    server = read_table(raw, "server", problems)
    check_keys(server, "server", {"listen", "ca_cert", "server_cert", "server_key", "crl",
                                  "state_root", "upload_memory_mb", "stream_window_kb",
                                  "health_listen", "metrics_listen"}, problems)
    defaults = ServerConfig()
    listen = _address(server, "listen", problems, default=defaults.listen) or defaults.listen
    health = _address(server, "health_listen", problems, default=None)
    metrics = _address(server, "metrics_listen", problems, default=None)
    taken: dict[str, str] = {listen: "server.listen"}
    for key, address in (("health_listen", health), ("metrics_listen", metrics)):
        if address is not None and address in taken:
            problems.append(f"server.{key}: {address} is already {taken[address]}")
        elif address is not None:
            taken[address] = f"server.{key}"
    deployment = DeploymentConfig(
        name=str(name), silos=silos, operators=operators, max_concurrent_jobs=max_jobs,
        approval_deadline_s=deadline, listen=listen,
        ca_cert=read_path(server, "ca_cert", "server", base_dir, defaults.ca_cert, problems),
        server_cert=read_path(server, "server_cert", "server", base_dir, defaults.server_cert,
                              problems),
        server_key=read_path(server, "server_key", "server", base_dir, defaults.server_key,
                             problems),
        crl=(read_path(server, "crl", "server", base_dir, Path("crl.pem"), problems)
             if "crl" in server else None),
        state_root=read_path(server, "state_root", "server", base_dir, Path("state"),
                             problems),
        upload_memory_mb=read_int(server, "upload_memory_mb", "server.upload_memory_mb",
                                  problems, defaults.upload_memory_mb, low=1),
        stream_window_kb=read_int(server, "stream_window_kb", "server.stream_window_kb",
                                  problems, defaults.stream_window_kb, low=16, high=1 << 20),
        health_listen=health, metrics_listen=metrics, source=source)
    if problems:
        raise DeploymentError(problems, str(source) if source else "deployment")
    return deployment


def _names(table: dict[str, Any], key: str, what: str, problems: list[str], *,
           required: bool) -> tuple[str, ...]:
    """A list of unique certificate subjects at deployment.`key` (a problem for each bad one)."""
    path = f"deployment.{key}"
    value = table.get(key)
    if value is None and not required:
        return ()
    if not isinstance(value, list) or (required and not value):
        problems.append(f"{path}: must be a{' non-empty' if required else ''} list of {what} "
                        "names (certificate subjects)")
        return ()
    for i, name in enumerate(value):
        if not valid_name(name):
            problems.append(f"{path}[{i}]: {shown(name)} is not a valid {what} name "
                            f"({NAME_RULE})")
    if len(set(map(str, value))) != len(value):
        problems.append(f"{path}: names must be unique")
    return tuple(str(name) for name in value)


def _address(table: dict[str, Any], key: str, problems: list[str],
             default: str | None) -> str | None:
    """A 'host:port' field of [server] (`default` when absent)."""
    value = table.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not valid_address(value):
        problems.append(f"server.{key}: expected 'host:port', got {shown(value)}")
        return default
    return value
