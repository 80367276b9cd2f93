"""The coordinator's budget for uploads in assembly: takers wait, a huge one goes alone,
a caller that stops wanting gives up, and the plan's [server] knobs are checked."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trellis.coordinator.serving.upload_budget import UploadBudget, stream_window_options
from trellis.protos.plan import PlanError, load_plan

MB = 1 << 20


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_a_taker_waits_until_the_budget_has_room_then_goes() -> None:
    budget = UploadBudget(10 * MB)
    order: list[str] = []
    first = budget.hold(8 * MB)
    assert first.__enter__() is True
    assert budget.used == 8 * MB

    def second() -> None:
        with budget.hold(4 * MB, poll_s=0.01) as granted:
            order.append(f"second granted={granted} used={budget.used // MB}")

    thread = threading.Thread(target=second)
    thread.start()
    _until(lambda: budget.waited == 1)
    assert order == [] and thread.is_alive()      # 8 + 4 > 10: it waits
    order.append("first done")
    first.__exit__(None, None, None)
    thread.join(10)
    assert order == ["first done", "second granted=True used=4"]
    assert budget.used == 0 and budget.peak == 8 * MB


def test_takers_that_fit_together_do_not_wait() -> None:
    budget = UploadBudget(10 * MB)
    with budget.hold(4 * MB) as a, budget.hold(6 * MB) as b:
        assert (a, b, budget.used, budget.waited) == (True, True, 10 * MB, 0)
    assert budget.used == 0


def test_a_tensor_larger_than_the_budget_goes_alone() -> None:
    budget = UploadBudget(1 * MB)
    with budget.hold(64 * MB) as granted:
        assert granted and budget.used == 64 * MB
    assert budget.used == 0 and budget.waited == 0


def test_a_waiting_taker_gives_up_when_no_longer_wanted_and_holds_nothing() -> None:
    budget = UploadBudget(2 * MB)
    wanted = threading.Event()
    wanted.set()
    outcome: list[bool] = []
    with budget.hold(2 * MB):
        def taker() -> None:
            with budget.hold(1 * MB, still_wanted=wanted.is_set, poll_s=0.01) as granted:
                outcome.append(granted)

        thread = threading.Thread(target=taker)
        thread.start()
        _until(lambda: budget.waited == 1)
        wanted.clear()                    # its stream closed, or the server is stopping
        thread.join(10)
        assert outcome == [False] and budget.used == 2 * MB
    assert budget.used == 0


def test_an_exception_in_the_body_gives_the_bytes_back() -> None:
    budget = UploadBudget(4 * MB)
    with pytest.raises(ValueError), budget.hold(3 * MB):
        raise ValueError("a corrupt upload")
    assert budget.used == 0


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        UploadBudget(0)


def test_the_stream_window_is_fixed_not_probed() -> None:
    assert dict(stream_window_options(64)) == {"grpc.http2.bdp_probe": 0,
                                               "grpc.http2.lookahead_bytes": 65536}


def _plan(tmp_path: Path, server_extra: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(f"""
[federation]
id = "budget"
algorithm = "fedavg"
rounds = 1
min_silos = 2
silos = ["a", "b"]

[server]
listen = "127.0.0.1:50051"
{server_extra}
""")
    return path


def test_the_plan_sets_both_knobs_with_defaults(tmp_path: Path) -> None:
    default = load_plan(_plan(tmp_path, ""))
    assert (default.server.upload_memory_mb, default.server.stream_window_kb) == (256, 64)
    chosen = load_plan(_plan(tmp_path, "upload_memory_mb = 1024\nstream_window_kb = 1024"))
    assert (chosen.server.upload_memory_mb, chosen.server.stream_window_kb) == (1024, 1024)


def test_the_plan_refuses_bad_knobs_by_name(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as refused:
        load_plan(_plan(tmp_path, 'upload_memory_mb = 0\nstream_window_kb = "big"'))
    text = str(refused.value)
    assert "server.upload_memory_mb: must be >= 1, got 0" in text
    assert "server.stream_window_kb: must be an integer, got 'big'" in text


def test_metrics_export_the_budget_and_count_each_wait() -> None:
    from prometheus_client import generate_latest

    from trellis.coordinator.serving.metrics import CoordinatorMetrics

    metrics = CoordinatorMetrics()
    budget = UploadBudget(4 * MB)
    metrics.watch_uploads(budget)

    def sample(name: str) -> float:
        value = metrics.registry.get_sample_value(name)
        assert value is not None, generate_latest(metrics.registry).decode()
        return value

    with budget.hold(3 * MB):
        assert sample("trellis_coordinator_upload_memory_bytes") == 3 * MB
        def take() -> None:
            with budget.hold(2 * MB, poll_s=0.01):
                pass

        waiter = threading.Thread(target=take)
        waiter.start()
        _until(lambda: budget.waited == 1)
    waiter.join(10)
    assert sample("trellis_coordinator_upload_memory_limit_bytes") == 4 * MB
    assert sample("trellis_coordinator_upload_waits_total") == 1


def test_an_asyncio_taker_waits_on_the_loop_then_goes_or_gives_up() -> None:
    """hold_async: a coroutine waits for room without a thread of its own, goes when bytes
    come back, and gives up holding nothing once no longer wanted."""
    import asyncio

    async def scenario() -> list[str]:
        budget = UploadBudget(10 * MB)
        order: list[str] = []
        wanted = True

        async def taker(name: str, size: int) -> None:
            async with budget.hold_async(size, still_wanted=lambda: wanted,
                                         poll_s=0.01) as granted:
                order.append(f"{name} granted={granted} used={budget.used // MB}")

        async with budget.hold_async(8 * MB) as first:
            assert first
            second = asyncio.create_task(taker("second", 4 * MB))
            while budget.waited < 1:
                await asyncio.sleep(0)
            order.append("first done")
        await second
        async with budget.hold_async(10 * MB):
            third = asyncio.create_task(taker("third", 1 * MB))
            while budget.waited < 2:
                await asyncio.sleep(0)
            wanted = False                 # its stream closed, or the server is stopping
            await third
        assert budget.used == 0 and budget.peak == 10 * MB
        return order

    assert asyncio.run(scenario()) == ["first done", "second granted=True used=4",
                                       "third granted=False used=10"]
