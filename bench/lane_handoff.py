"""What handing one run to a lane thread costs the event loop, in-process.

An empty work item's round trip (loop -> lane thread -> loop), timed over rounds of
``--items`` awaited one after the other, interleaved between the lane thread of
``service/inference_lanes.py`` (a queue, and ``call_soon_threadsafe`` back) and what
it replaced (``run_in_executor`` on a one-worker ``ThreadPoolExecutor``). Two numbers
each: the wall time of a round trip (mostly the thread's wake-up, which a loaded
machine stretches) and the loop thread's CPU time per round trip (``thread_time``:
what the hand-off takes from the loop, which serves the requests). Ratios are the
point: on a shared machine the absolute numbers move between runs.

    .venv/bin/python -m bench.lane_handoff
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from service.inference_lanes import LaneThread

Handoff = Callable[[Callable[[], None]], Awaitable[None]]


def nothing() -> None:
    return None


async def round_trips(handoff: Handoff, items: int) -> tuple[float, float]:
    """(wall, loop CPU) seconds per round trip, over ``items`` of them."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(items):
        await handoff(nothing)
    return (time.perf_counter() - wall) / items, (time.thread_time() - cpu) / items


async def measure(rounds: int, items: int) -> dict[str, list[tuple[float, float]]]:
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="executor")
    lane = LaneThread("inference-bench")

    async def via_executor(work: Callable[[], None]) -> None:
        await loop.run_in_executor(executor, work)

    async def via_lane(work: Callable[[], None]) -> None:
        await lane.submit(work)

    results: dict[str, list[tuple[float, float]]] = {"executor": [], "lane": []}
    try:
        for _ in range(rounds):
            results["executor"].append(await round_trips(via_executor, items))
            results["lane"].append(await round_trips(via_lane, items))
    finally:
        executor.shutdown()
        lane.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--items", type=int, default=2000)
    args = parser.parse_args()
    results = asyncio.run(measure(args.rounds, args.items))
    for index, what in ((0, "wall per round trip"), (1, "loop CPU per round trip")):
        old = [r[index] for r in results["executor"]]
        new = [r[index] for r in results["lane"]]
        ratios = sorted(o / n for o, n in zip(old, new, strict=True))
        print(
            f"{what}: executor {statistics.median(old) * 1e6:.1f} us, "
            f"lane thread {statistics.median(new) * 1e6:.1f} us (medians); "
            f"executor/lane per round: min {ratios[0]:.2f}, "
            f"median {statistics.median(ratios):.2f}, max {ratios[-1]:.2f}"
        )


if __name__ == "__main__":
    main()
