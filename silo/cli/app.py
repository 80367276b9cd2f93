"""``silo`` command line: join a federation, make an identity request, make demo data, cut a
heterogeneous graph into silo graphs, show a silo's status, predict with its final model.

Exit codes: 0 success; 1 the federation failed (or the coordinator was never reached); 2 bad input
(data folder, identity, options, policy file), a coordinator that refuses this silo as configured
(its certificate, name or version) or a plan this silo's --policy refuses: mistakes of
configuration that retrying cannot fix -- always reported as one readable line; 130 and 143
`join` stopped by Ctrl-C or SIGTERM (resumable).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from trellis.protos.exposition import MetricsEndpoint
    from trellis.silo.federation.agent import SiloAgent
    from trellis.silo.training.launch import Launch
    from trellis.silo.training.ranks import RankGroup

app = typer.Typer(help="Trellis silo agent: trains on local graphs, shares only what the "
                       "algorithm declares, masked.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
pki_app = typer.Typer(help="This silo's identity.", no_args_is_help=True)
app.add_typer(pki_app, name="pki")
audit_app = typer.Typer(help="This silo's audit log, for reviewers.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")


def _show_version(value: bool) -> None:
    if value:
        from trellis.protos.version import version_line

        typer.echo(version_line("silo"))
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version,
                                       is_eager=True, help="show the version and exit")
          ) -> None:
    """Trellis silo."""

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def configure_threads(threads: int | None) -> None:
    """Limit torch/OpenMP threads; must run before torch is imported to take full effect.

    Several processes sharing the cores with spin-waiting OpenMP threads slow rounds down by
    an order of magnitude, so a limited silo also waits passively.
    """
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except ImportError as exc:
        typer.echo(f"error: a silo trains with torch, which is not installed ({exc}); install "
                   "the silo extra: pip install 'trellis-fgl[silo]'", err=True)
        raise typer.Exit(2) from None

    if threads:
        torch.set_num_threads(threads)


def _stop_before_joining(command: Callable[..., None]) -> Callable[..., None]:
    """A stop before the federation (imports, data, model) ends the command with one line and
    its exit code (130, or 143 for SIGTERM); once the agent runs, `_run_agent` answers it."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except KeyboardInterrupt as exc:
            from trellis.protos.stop import describe, exit_code

            typer.echo(f"{describe(exc)} before joining the federation; nothing was sent",
                       err=True)
            raise typer.Exit(exit_code(exc)) from None

    return run


@app.command()
@_stop_before_joining
def join(coordinator: str = typer.Option(..., "--coordinator", help="host:port to dial"),
         data: Path = typer.Option(..., "--data", help="TU-format graph folder, or a "
                                                        "heterogeneous graph folder for fedhgn"),
         identity: Path = typer.Option(Path("id"), "--identity",
                                       help="folder with this silo's key, certificate, ca.crt"),
         device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N"),
         state_dir: Path = typer.Option(None, "--state-dir",
                                        help="audit log and final model (default: "
                                             "./silo-state/<name>)"),
         threads: int = typer.Option(None, help="torch threads (default: all cores)"),
         report: str = typer.Option("val_acc,test_acc,train_loss",
                                    help="metrics to report, comma-separated, or 'none'"),
         connect_timeout: float = typer.Option(300.0, help="seconds to keep retrying the "
                                                          "coordinator"),
         policy_file: Path = typer.Option(None, "--policy",
                                          help="TOML file of the plans this silo accepts; a "
                                               "plan that breaks it is refused before anything "
                                               "is sent (exit 2)"),
         metrics_listen: str = typer.Option(None, "--metrics-listen",
                                            help="serve Prometheus metrics at "
                                                 "http://host:port/metrics"),
         linger: float = typer.Option(0.0, "--linger", min=0.0,
                                      help="seconds to keep the metrics endpoint up after the "
                                           "federation ends, so the last scrape sees its end"),
         log_format: str = typer.Option("text", "--log-format",
                                        help="text (for people) or json (one object per line, "
                                             "for log shippers)"),
         nproc: int = typer.Option(None, "--nproc",
                                   help="processes that train this silo's model together, each "
                                        "on its part of every mini-batch (torch.distributed: "
                                        "gloo on CPU, nccl with one GPU each); default 1, or "
                                        "torchrun's process count")) -> None:
    """Join a federation and train until it finishes."""
    from trellis.protos.exposition import EndpointError, serve_metrics
    from trellis.protos.fields import valid_address
    from trellis.protos.logs import FORMATS, make_logger
    from trellis.protos.stop import stop_on_sigterm
    from trellis.silo.operations.metrics import SiloMetrics
    from trellis.silo.privacy.policy import Policy, PolicyError, load_policy
    from trellis.silo.progress_bar import status

    if log_format not in FORMATS:
        _fail(f"--log-format {log_format!r}: expected one of {', '.join(FORMATS)}")
    if not valid_address(coordinator):
        _fail(f"--coordinator {coordinator!r}: expected host:port, e.g. "
              "coord.example.org:50051 (without a port, gRPC would dial 443)")
    from trellis.silo.training.launch import launch_of, threads_per_process

    try:
        launch = launch_of(nproc, os.environ)
    except ValueError as exc:
        _fail(str(exc))
    if launch.parallel and threads is None:
        threads = threads_per_process(launch)
    if launch.rank > 0:
        _serve_as_worker(launch, data, device, threads, log_format)
        return
    # From here a stop request (docker stop, kubectl delete, systemctl stop) is a Ctrl-C: before
    # the federation it ends the command at once, as Ctrl-C does; during it, as below.
    stop_on_sigterm()
    metrics: SiloMetrics | None = None
    endpoint: MetricsEndpoint | None = None
    if metrics_listen is not None:
        # Bound before the data loads, so a taken port is refused at once.
        metrics = SiloMetrics()
        try:
            endpoint = serve_metrics(metrics_listen, metrics.registry)
        except EndpointError as exc:
            _fail(str(exc))
    policy: Policy | None = None
    if policy_file is not None:
        try:
            policy = load_policy(policy_file)
        except PolicyError as exc:
            _fail(str(exc))
    configure_threads(threads)
    import torch

    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import load_identity
    from trellis.protos.plan import PublicPlan
    from trellis.silo.data.hetero import HeteroFormatError, HeteroGraph
    from trellis.silo.data.split import (
        DatasetTooSmall,
        check_split,
        graph_labels,
        stratified_split,
    )
    from trellis.silo.data.tu import DataFormatError
    from trellis.silo.federation.agent import SiloAgent
    from trellis.silo.federation.session import SiloSession
    from trellis.silo.training.hgn_trainer import HeteroTrainer
    from trellis.silo.training.memory import return_freed_memory
    from trellis.silo.training.trainer import LocalTrainer
    from trellis.silo.training.trainers import load_silo_data, make_silo_trainer

    try:
        ident = load_identity(identity)
    except CryptoError as exc:
        _fail(str(exc))
    resolved = _device(device, torch, launch)
    try:
        with status(f"loading {data}"):
            dataset = load_silo_data(data)
        if not isinstance(dataset, HeteroGraph):
            # Checked before anything is sent: the split's sizes do not depend on its seed.
            labels = graph_labels(dataset.graphs)
            split = stratified_split(labels)
            check_split(labels, split, str(data))
            if launch.world > len(split.train):
                _fail(f"--nproc {launch.world}: {data} has {len(split.train)} training graphs; "
                      f"each process needs at least one (use --nproc {len(split.train)} or "
                      "fewer)")
        elif launch.parallel:
            _fail(f"--nproc {launch.world}: {data} is a heterogeneous graph, and FedHGN's "
                  "full-graph trainer runs in one process; join without --nproc")
    except (DataFormatError, HeteroFormatError, DatasetTooSmall) as exc:
        _fail(str(exc))
    chosen = () if report.strip() == "none" else tuple(
        r.strip() for r in report.split(",") if r.strip())
    graphs = [dataset]

    group: RankGroup | None = None

    def make_trainer(plan: PublicPlan) -> LocalTrainer | HeteroTrainer:
        if group is None:
            trainer: LocalTrainer | HeteroTrainer = make_silo_trainer(graphs[0], plan,
                                                                      ident.name, resolved)
        else:
            from trellis.silo.training.parallel_trainer import ParallelTrainer

            trainer = ParallelTrainer.lead(group, graphs[0], plan, ident.name, resolved)
        # The trainer packed what it needs; the loaded graph list (node features and edges
        # once more, over 1 GB for COLLAB) is released for the rest of the federation.
        graphs.clear()
        return_freed_memory()
        return trainer

    session = SiloSession(ident, make_trainer, report=chosen, policy=policy)
    folder = state_dir or Path("silo-state") / ident.name
    log = make_logger(ident.name, log_format).info

    if isinstance(dataset, HeteroGraph):
        # Counts only: the silo's own log may name nothing of its schema either.
        log(f"heterogeneous graph from {data}: {sum(dataset.num_nodes.values())} nodes, "
            f"{dataset.num_classes} classes, {dataset.train_idx.size} training nodes")
    else:
        log(f"{len(dataset.graphs)} graphs from {data} ({dataset.feature_kind} features, "
            f"{dataset.num_classes} classes) on {resolved}")
    from trellis.silo.models.dense import dense_path, onednn_setting

    try:
        onednn_setting()                     # read whatever the device: a typo fails here
        if resolved.type == "cpu":
            log(f"dense layers: {dense_path().reason}")
    except ValueError as exc:
        _fail(str(exc))
    del dataset
    try:
        if launch.parallel:
            from trellis.silo.training.ranks import RanksFailed, form_group, worker_command

            backend = "nccl" if resolved.type == "cuda" else "gloo"
            log(f"training with {launch.world} processes ({backend}, {threads} torch "
                f"thread{'s' if threads != 1 else ''} each); rank 0 alone talks to the "
                "coordinator")
            try:
                group = form_group(launch, resolved, worker_command())
                group.ready()
            except RanksFailed as exc:
                _fail(str(exc), EXIT_FAILED)
        _run_agent(SiloAgent(coordinator, ident, session, folder,
                             connect_timeout_s=connect_timeout, log=log, metrics=metrics),
                   folder, endpoint, linger, log)
    finally:
        if group is not None:
            group.close()       # STOP to the workers, or ends them if they cannot hear it


def _run_agent(agent: SiloAgent, folder: Path, endpoint: MetricsEndpoint | None,
               linger: float, log: Callable[[str], object]) -> None:
    """Run the agent until the federation ends; its failures as one line and an exit code."""
    from trellis.protos.stop import EXIT_GRACE_S, describe, exit_code, exit_within
    from trellis.silo.federation.agent import FederationFailed, SiloRefused
    from trellis.silo.privacy.policy import PlanRefused

    try:
        agent.run()
    except SiloRefused as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except PlanRefused as exc:
        broken = len(exc.violations)
        _fail(f"refused the plan of federation {exc.plan.federation}: it breaks {broken} "
              f"clause{'s' if broken > 1 else ''} of {exc.policy.source} (listed above); "
              "nothing was sent. Ask the coordinator operator to change the plan, or change "
              "the policy")
    except FederationFailed as exc:
        _fail(str(exc), EXIT_FAILED)
    except ValueError as exc:
        _fail(str(exc))
    except KeyboardInterrupt as exc:
        how = describe(exc)
        log(f"{how}; the same `silo join` goes on from the last round this silo finished "
            f"(state in {folder})")
        if endpoint is not None:
            endpoint.stop()
        exit_within(EXIT_GRACE_S, exit_code(exc))
        raise typer.Exit(exit_code(exc)) from None
    if endpoint is not None and linger > 0:
        try:
            time.sleep(linger)       # the process ends next: let the last scrape see the end
        except KeyboardInterrupt:
            pass                     # the federation has ended: a stop only cuts this short


def _device(spec: str, torch, launch: Launch):  # type: ignore[no-untyped-def]
    """The torch device of this process; with --nproc, each process's own GPU (LOCAL_RANK)."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
        if not launch.parallel:
            return torch.device(spec)
    try:
        device = torch.device(spec)
    except RuntimeError:
        _fail(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        _fail(f"--device {spec}: no CUDA device is available on this machine")
    if not launch.parallel or device.type != "cuda":
        return device
    if device.index is not None:
        _fail(f"--device {spec} names one GPU, but with --nproc each process takes the GPU of "
              "its LOCAL_RANK: give --device cuda (CUDA_VISIBLE_DEVICES picks the GPUs)")
    count = torch.cuda.device_count()
    if launch.torchrun and launch.local_rank >= count:
        _fail(f"LOCAL_RANK {launch.local_rank}: this machine has {count} CUDA device(s), one "
              f"per process; start at most {count} processes per machine")
    if not launch.torchrun and launch.world > count:
        _fail(f"--nproc {launch.world}: this machine has {count} CUDA device(s), one per "
              f"process; use --nproc {count} or fewer, or --device cpu")
    return torch.device("cuda", launch.local_rank)


def _serve_as_worker(launch: Launch, data: Path, device: str, threads: int | None,
                     log_format: str) -> None:
    """A worker of `silo join --nproc` (RANK above 0): load the data, then train with rank 0
    until it says stop. It loads no identity and talks to nobody but its silo's processes."""
    from trellis.protos.logs import make_logger

    configure_threads(threads)
    import torch

    from trellis.silo.data.datasets import load_graph_folder
    from trellis.silo.data.tu import GraphDataset
    from trellis.silo.training.parallel_trainer import serve
    from trellis.silo.training.ranks import RanksFailed, form_group, gist
    from trellis.silo.training.trainers import load_silo_data

    log = make_logger(f"rank {launch.rank}", log_format).info
    os.environ["TRELLIS_PROGRESS"] = "0"       # rank 0 alone draws progress bars (torchrun)
    resolved = _device(device, torch, launch)
    try:
        group = form_group(launch, resolved)
    except RanksFailed as exc:
        _fail(str(exc), EXIT_FAILED)
    try:
        dataset = load_silo_data(data)
    except ValueError as exc:          # DataFormatError, HeteroFormatError
        group.close()
        _fail(str(exc))
    if not isinstance(dataset, GraphDataset):
        group.close()
        _fail(f"--nproc {launch.world}: {data} is a heterogeneous graph, and FedHGN's "
              "full-graph trainer runs in one process")
    graphs: list[GraphDataset] = [dataset]
    del dataset

    def load() -> GraphDataset:
        # The graphs loaded already for the first plan; a later plan (tests) loads them again.
        return graphs.pop() if graphs else load_graph_folder(data)

    try:
        group.ready()
        serve(group, load, log)
    except RuntimeError as exc:        # rank 0 ended, or a collective failed
        _fail(f"rank {launch.rank} stops: lost this silo's other processes ({gist(exc)})",
              EXIT_FAILED)
    finally:
        group.close()


@pki_app.command("request")
def pki_request(name: str = typer.Option(..., "--name", help="this silo's name, as admitted "
                                                             "in the plan"),
                dir: Path = typer.Option(Path("id"), "--dir", help="identity folder")) -> None:
    """Create this silo's private key (kept here) and a CSR for the coordinator operator."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import request_identity

    try:
        csr = request_identity(name, dir)
    except CryptoError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {dir / (name + '.key')} (private, mode 0600) and {csr}; send the .csr "
               "to the coordinator operator")


@pki_app.command("renew")
def pki_renew(dir: Path = typer.Option(Path("id"), "--dir", help="identity folder")) -> None:
    """Re-key this silo: retire its key and certificate, make a new key and CSR (same name)."""
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import renew_identity

    try:
        csr, retired = renew_identity(dir)
    except CryptoError as exc:
        _fail(str(exc))
    serial = retired.name.rpartition("-")[2]
    typer.echo(f"moved the old key and certificate to {retired}; wrote a new key and {csr}. "
               "Send the .csr to the coordinator operator to sign, then ask them to revoke "
               f"the old certificate: coordinator pki revoke --ca CA_DIR --serial {serial}")


@app.command("make-demo-data")
def make_demo_data(out: Path = typer.Option(..., "--out", help="folder to write (TU format)"),
                   domain: str = typer.Option(..., help="molecules | social | bio"),
                   graphs: int = typer.Option(300, help="number of graphs"),
                   seed: int = typer.Option(0, help="generator seed"),
                   name: str = typer.Option(None, help="dataset name (default: domain)")) -> None:
    """Write a synthetic graph-classification dataset (no download needed)."""
    from trellis.silo.data.synthetic import DOMAINS, write_tu_folder

    if domain not in DOMAINS:
        _fail(f"--domain {domain!r}: valid choices: {', '.join(DOMAINS)}")
    folder = write_tu_folder(out, name or domain.upper(), domain, graphs, seed=seed)
    typer.echo(f"wrote {graphs} {domain} graphs to {folder}")


@app.command("split-hetero")
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
        _fail(f"--method {method!r}: valid choices: {', '.join(METHODS)}")
    if clients < 3:
        _fail("--clients must be at least 3 (each shared edge goes to 2..K-1 silos)")
    if out.exists() and any(out.iterdir()):
        _fail(f"--out {out} is not empty")
    try:
        write_split(load_hetero_folder(source), method, clients, seed, out)
    except HeteroFormatError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {clients} silo graphs ({method}) to {out}")


@app.command("split-tu")
def split_tu(source: Path = typer.Option(..., "--input", help="TU dataset folder to cut"),
             clients: int = typer.Option(..., help="number of silo datasets K (at least 2)"),
             out: Path = typer.Option(..., "--out", help="folder for client-0..K-1"),
             seed: int = typer.Option(123, help="seed of the reference's random assignment")
             ) -> None:
    """Cut one TU dataset into K silo datasets as GCFL's oneDS experiments did."""
    from trellis.silo.data.tu_split import write_oneds_split

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        _fail(f"--out {out} is not an empty folder")
    try:
        folders = write_oneds_split(source, clients, out, seed)
    except ValueError as exc:       # DataFormatError included
        _fail(str(exc))
    sizes = ", ".join(str(n) for n in folders.values())
    typer.echo(f"wrote {clients} silo datasets to {out} (graphs per silo: {sizes})")


@app.command()
def status(state_dir: Path = typer.Option(..., "--state-dir", help="the silo's state folder "
                                                                   "(as given to silo join)"),
           identity: Path = typer.Option(None, "--identity",
                                         help="identity folder: also check the audit log's "
                                              "signatures with this silo's certificate"),
           as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """What this silo has done, from its own files: rounds, its own metrics, what it sent."""
    import json

    from trellis.silo.operations.status import format_status, silo_status

    try:
        found = silo_status(state_dir, identity)
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(found, indent=2) if as_json else format_status(found))


@app.command()
def predict(model: Path = typer.Option(..., "--model", help="a silo's final_model.pt"),
            data: Path = typer.Option(..., "--data", help="TU folder of graphs to classify "
                                                          "(FedHGN: the silo's graph folder)"),
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
        _fail(str(exc))
    except OSError as exc:
        _fail(f"--out {out}: cannot write ({exc.strerror})")
    label = final.label
    accuracy = found.accuracy
    typer.echo(f"predicted {len(found.predicted)} {found.id_column}s with {label.get('silo')}'s "
               f"final model ({label.get('algorithm')}, federation {label.get('federation')}, "
               f"round {label.get('round')})"
               + (f"; accuracy {accuracy:.4f} against the folder's labels"
                  if accuracy is not None else "") + f"; wrote {out}")


@audit_app.command("report")
def audit_report(state_dir: Path = typer.Option(..., "--state-dir",
                                                help="the silo's state folder (audit.jsonl "
                                                     "and audit.jsonl.head)"),
                 identity: Path = typer.Option(None, "--identity",
                                               help="the silo's identity folder: its "
                                                    "certificate checks the log's signatures"),
                 out: Path = typer.Option(..., "--out", help="report.md or report.html"),
                 fmt: str = typer.Option(None, "--format",
                                         help="md | html (default: from --out's suffix)")
                 ) -> None:
    """Write a reviewer's report: what left this silo and what reached it, round by round, the
    plan it accepted and whether its audit log verifies (exit 1 if it does not)."""
    from datetime import UTC, datetime

    from trellis.crypto.errors import CryptoError
    from trellis.protos.document import format_for, render
    from trellis.protos.files import write_atomic
    from trellis.silo.operations.audit_report import AUDIT_LOG, report_state_dir

    try:
        chosen = format_for(out, fmt)
    except ValueError as exc:
        _fail(str(exc))
    if not (state_dir / AUDIT_LOG).is_file():
        _fail(f"no audit log {state_dir / AUDIT_LOG}: give the --state-dir that `silo join` "
              "used (default ./silo-state/<name>)")
    if identity is not None and not identity.is_dir():
        _fail(f"--identity {identity}: no such folder")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        document, verification = report_state_dir(state_dir, identity, generated=generated)
        text = render(document, chosen).encode()
        write_atomic(out, lambda handle: handle.write(text))
    except CryptoError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write {out}: {exc.strerror}")
    if verification.ok:
        typer.echo(f"wrote {out}: the audit log verifies ({verification.records} records)")
    else:
        _fail(f"wrote {out}, but the audit log does NOT verify: {verification.problems[0]} "
              f"({len(verification.problems)} problem(s), all listed in the report)",
              EXIT_FAILED)


def main() -> None:
    """Entry point of the `silo` command and of `python -m trellis.silo.cli`."""
    from trellis.protos.stop import run_command

    run_command(app)


if __name__ == "__main__":
    main()
