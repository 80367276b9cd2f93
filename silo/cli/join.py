"""`silo join`: join a federation and train until it ends, on one process or several (--nproc)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trellis.protos.devices import DEVICE_HELP
from trellis.silo.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, fail
from trellis.silo.cli.threads import configure_threads

if TYPE_CHECKING:
    from trellis.protos.exposition import MetricsEndpoint
    from trellis.silo.federation.agent import SiloAgent
    from trellis.silo.training.launch import Launch
    from trellis.silo.training.ranks import RankGroup


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


@_stop_before_joining
def join(coordinator: str = typer.Option(..., "--coordinator", help="host:port to dial"),
         data: Path = typer.Option(..., "--data", help="TU-format graph folder, or a "
                                                        "heterogeneous graph folder for fedhgn"),
         identity: Path = typer.Option(Path("id"), "--identity",
                                       help="folder with this silo's key, certificate, ca.crt"),
         device: str = typer.Option("auto", help=DEVICE_HELP),
         state_dir: Path = typer.Option(None, "--state-dir",
                                        help="audit log and final model (default: "
                                             "./silo-state/<name>)"),
         threads: int = typer.Option(None, help="torch threads (default: all cores)"),
         report: str = typer.Option(None, help="metrics to report, comma-separated, or "
                                                "'none' (default: val_acc,test_acc,train_loss "
                                                "and the plan's training.validation_metric)"),
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
                                        "torchrun's process count"),
         job: int = typer.Option(None, "--job", min=1,
                                 help="a standing coordinator's job to take part in (`silo "
                                      "serve` passes it)"),
         approved_plan: str = typer.Option(None, "--approved-plan",
                                           help="with --job: the SHA-256 of the public plan "
                                                "this silo approved; any other is refused "
                                                "before anything is sent"),
         init_model: Path = typer.Option(None, "--init-model",
                                         help="the public initial model the plan names "
                                              "(model.init_sha256); its SHA-256 is checked "
                                              "before anything is sent")) -> None:
    """Join a federation and train until it finishes."""
    from trellis.protos.exposition import EndpointError, serve_metrics
    from trellis.protos.fields import valid_address
    from trellis.protos.logs import FORMATS, make_logger
    from trellis.protos.stop import stop_on_sigterm
    from trellis.silo.operations.metrics import SiloMetrics
    from trellis.silo.privacy.policy import Policy, PolicyError, load_policy
    from trellis.silo.progress_bar import status

    if log_format not in FORMATS:
        fail(f"--log-format {log_format!r}: expected one of {', '.join(FORMATS)}")
    if not valid_address(coordinator):
        fail(f"--coordinator {coordinator!r}: expected host:port, e.g. "
             "coord.example.org:50051 (without a port, gRPC would dial 443)")
    from trellis.silo.training.launch import launch_of, threads_per_process

    try:
        launch = launch_of(nproc, os.environ)
    except ValueError as exc:
        fail(str(exc))
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
            fail(str(exc))
    policy: Policy | None = None
    if policy_file is not None:
        try:
            policy = load_policy(policy_file)
        except PolicyError as exc:
            fail(str(exc))
    configure_threads(threads)
    import torch

    from trellis.silo.training.initial_model import InitialModelMismatch, read_initial_model

    initial = None
    if init_model is not None:
        try:
            initial = read_initial_model(init_model)
        except InitialModelMismatch as exc:
            fail(str(exc))
    from trellis.crypto.errors import CryptoError
    from trellis.crypto.pki import load_identity
    from trellis.protos.plan import PublicPlan
    from trellis.silo.data.hetero import HeteroFormatError, HeteroGraph
    from trellis.silo.data.molecules.dataset_check import dataset_fingerprint
    from trellis.silo.data.split import DatasetTooSmall, InvalidSplit, graph_labels, silo_split
    from trellis.silo.data.tu import DataFormatError
    from trellis.silo.federation.agent import SiloAgent
    from trellis.silo.federation.session import SiloSession
    from trellis.silo.training.hgn_trainer import HeteroTrainer
    from trellis.silo.training.memory import return_freed_memory
    from trellis.silo.training.trainer import LocalTrainer
    from trellis.silo.training.trainers import check_initial, load_silo_data, make_silo_trainer

    try:
        ident = load_identity(identity)
    except CryptoError as exc:
        fail(str(exc))
    resolved = _device(device, torch, launch)
    try:
        with status(f"loading {data}"):
            dataset = load_silo_data(data)
        if not isinstance(dataset, HeteroGraph):
            # Checked before anything is sent: the split's sizes do not depend on its seed (a
            # prepared split, the dataset's own, has no seed).
            split = silo_split(graph_labels(dataset.graphs), dataset.split, str(data))
            if launch.world > len(split.train):
                fail(f"--nproc {launch.world}: {data} has {len(split.train)} training graphs; "
                     f"each process needs at least one (use --nproc {len(split.train)} or "
                     "fewer)")
        elif launch.parallel:
            fail(f"--nproc {launch.world}: {data} is a heterogeneous graph, and FedHGN's "
                 "full-graph trainer runs in one process; join without --nproc")
    except (DataFormatError, HeteroFormatError, DatasetTooSmall, InvalidSplit) as exc:
        fail(str(exc))
    chosen = None if report is None else () if report.strip() == "none" else tuple(
        r.strip() for r in report.split(",") if r.strip())
    graphs = [dataset]

    group: RankGroup | None = None

    def make_trainer(plan: PublicPlan) -> LocalTrainer | HeteroTrainer:
        check_initial(plan, initial)    # InitialModelMismatch: before anything is sent
        if group is None:
            trainer: LocalTrainer | HeteroTrainer = make_silo_trainer(
                graphs[0], plan, ident.name, resolved, initial=initial)
        else:
            from trellis.silo.training.parallel_trainer import ParallelTrainer

            trainer = ParallelTrainer.lead(group, graphs[0], plan, ident.name, resolved,
                                           initial)
        if initial is not None and isinstance(trainer, LocalTrainer):
            log(f"started from the initial model {initial.sha256} (the plan's [model] "
                f"init_sha256): {', '.join(trainer.started_from)}")
        if group is None and resolved.type != "cpu" and isinstance(trainer, LocalTrainer):
            # The plan's model decides (FedDense's batch norms): said once it is known.
            log(f"training steps for {plan.algorithm}: {trainer.graph_path.reason}; "
                f"evaluation: {trainer.evaluation_path}")
        # The trainer packed what it needs; the loaded graph list (node features and edges
        # once more, over 1 GB for COLLAB) is released for the rest of the federation.
        graphs.clear()
        return_freed_memory()
        return trainer

    # A plan's [data] reference_sha256 is checked against what the folder's manifest records.
    session = SiloSession(ident, make_trainer, report=chosen, policy=policy,
                          dataset_fingerprint=dataset_fingerprint(data))
    if job is not None:
        from trellis.silo.jobs.lifetime import end_with_parent

        end_with_parent()
    if approved_plan is not None:
        if job is None or len(approved_plan) != 64:
            fail("--approved-plan goes with --job and is a SHA-256 (64 hex digits)")
        session.approved_plan_sha256 = approved_plan
    folder = state_dir or Path("silo-state") / ident.name
    log = make_logger(ident.name, log_format).info

    if isinstance(dataset, HeteroGraph):
        # Counts only: the silo's own log may name nothing of its schema either.
        log(f"heterogeneous graph from {data}: {sum(dataset.num_nodes.values())} nodes, "
            f"{dataset.num_classes} classes, {dataset.train_idx.size} training nodes on "
            f"{resolved}")
    else:
        log(f"{len(dataset.graphs)} graphs from {data} ({dataset.feature_kind} features, "
            f"{dataset.num_classes} classes) on {resolved}")
    from trellis.silo.models.compiled import fused_path
    from trellis.silo.models.dense import dense_path, onednn_setting
    from trellis.silo.training.graphed_steps import graph_path

    try:
        onednn_setting()                     # read whatever the device: a typo fails here
        if resolved.type == "cpu":
            log(f"dense layers: {dense_path().reason}")
        log(f"forward pass: {fused_path(resolved).reason}")
        log(f"training steps: {graph_path(resolved).reason}")
    except ValueError as exc:
        fail(str(exc))
    del dataset
    from trellis.silo.training.warm_up import warm_up_optimisers

    warm_up_optimisers()        # before joining: round 1's deadlines start at the join
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
                fail(str(exc), EXIT_FAILED)
        _run_agent(SiloAgent(coordinator, ident, session, folder,
                             connect_timeout_s=connect_timeout, log=log, metrics=metrics,
                             job_id=job),
                   folder, endpoint, linger, log)
    finally:
        if group is not None:
            group.close()       # STOP to the workers, or ends them if they cannot hear it


def _run_agent(agent: SiloAgent, folder: Path, endpoint: MetricsEndpoint | None,
               linger: float, log: Callable[[str], object]) -> None:
    """Run the agent until the federation ends; its failures as one line and an exit code."""
    from trellis.protos.stop import EXIT_GRACE_S, describe, exit_code, exit_within
    from trellis.silo.data.molecules.dataset_check import DatasetMismatch
    from trellis.silo.federation.agent import FederationFailed, NothingToJoin, SiloRefused
    from trellis.silo.privacy.policy import PlanRefused
    from trellis.silo.training.initial_model import InitialModelMismatch

    try:
        agent.run()
    except NothingToJoin as exc:
        # A second `docker-compose up` after the federation finished: not a failure (exit 0).
        log(str(exc))
        return
    except (SiloRefused, DatasetMismatch, InitialModelMismatch) as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except PlanRefused as exc:
        broken = len(exc.violations)
        fail(f"refused the plan of federation {exc.plan.federation}: it breaks {broken} "
             f"clause{'s' if broken > 1 else ''} of {exc.policy.source} (listed above); "
             "nothing was sent. Ask the coordinator operator to change the plan, or change "
             "the policy")
    except FederationFailed as exc:
        fail(str(exc), EXIT_FAILED)
    except ValueError as exc:
        fail(str(exc))
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
    from trellis.silo.training.devices import resolve_device

    try:
        device = resolve_device(spec)
    except ValueError as exc:           # a misspelt device, or one this machine lacks
        fail(str(exc))
    if not launch.parallel or device.type != "cuda":
        return device
    if device.index is not None:
        fail(f"--device {spec} names one GPU, but with --nproc each process takes the GPU of "
             "its LOCAL_RANK: give --device cuda (CUDA_VISIBLE_DEVICES picks the GPUs)")
    count = torch.cuda.device_count()
    if launch.torchrun and launch.local_rank >= count:
        fail(f"LOCAL_RANK {launch.local_rank}: this machine has {count} CUDA device(s), one "
             f"per process; start at most {count} processes per machine")
    if not launch.torchrun and launch.world > count:
        fail(f"--nproc {launch.world}: this machine has {count} CUDA device(s), one per "
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
        fail(str(exc), EXIT_FAILED)
    try:
        dataset = load_silo_data(data)
    except ValueError as exc:          # DataFormatError, HeteroFormatError
        group.close()
        fail(str(exc))
    if not isinstance(dataset, GraphDataset):
        group.close()
        fail(f"--nproc {launch.world}: {data} is a heterogeneous graph, and FedHGN's "
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
        fail(f"rank {launch.rank} stops: lost this silo's other processes ({gist(exc)})",
             EXIT_FAILED)
    finally:
        group.close()
