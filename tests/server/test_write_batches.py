"""How the server's write batcher cuts batches: bounded by weight, a connection's writes in
order, other connections' small writes not held behind one connection's big ones."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from broker_embedded.server.batching import Batcher

MIB = 1024 * 1024


def test_a_small_write_goes_ahead_of_another_sources_big_ones_and_each_source_keeps_its_order() -> None:
    batches: list[list[str]] = []
    release = threading.Event()

    def run_batch(items: list[tuple[str, int]]) -> list[str]:
        batches.append([name for name, _ in items])
        release.wait(10)  # the first batch runs while the others queue
        return [name for name, _ in items]

    async def scenario() -> list[Any]:
        tasks: set[asyncio.Future[None]] = set()
        with ThreadPoolExecutor(2) as executor:
            batcher = Batcher(run_batch, executor, tasks.add, max_batches=1,
                               weigh=lambda item: item[1], max_batch_weight=4 * MIB)
            loop = asyncio.get_running_loop()
            done: list[asyncio.Future[Any]] = []

            def submit(name: str, size: int, source: str) -> None:
                future = loop.create_future()
                done.append(future)
                batcher.submit((name, size), future.set_result, source)

            submit("first", 10, "a")
            await asyncio.sleep(0.05)  # the first batch is running now
            submit("a-big-1", 4 * MIB, "a")
            submit("a-big-2", 4 * MIB, "a")
            submit("a-small", 10, "a")  # after a's big ones: it waits for them
            submit("b-small", 10, "b")  # another connection: goes with the next batch
            submit("c-big", 4 * MIB, "c")
            release.set()
            return list(await asyncio.gather(*done))

    answers = asyncio.run(scenario())
    assert answers == ["first", "a-big-1", "a-big-2", "a-small", "b-small", "c-big"]
    assert batches == [["first"], ["a-big-1", "b-small"], ["a-big-2", "a-small"], ["c-big"]]


class CountingExecutor(ThreadPoolExecutor):
    """A thread pool that counts the calls handed to it."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.handed = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.handed += 1
        return super().submit(fn, *args, **kwargs)


def test_the_batches_that_queue_while_one_runs_cost_no_further_hand_off_to_a_thread() -> None:
    release = threading.Event()
    loop_thread: list[threading.Thread] = []
    answered_on: list[threading.Thread] = []

    def run_batch(items: list[tuple[str, int]]) -> list[str]:
        release.wait(10)
        return [name for name, _ in items]

    async def scenario() -> tuple[list[Any], int, int]:
        tasks: set[asyncio.Future[None]] = set()
        loop_thread.append(threading.current_thread())
        with CountingExecutor(2) as executor:
            batcher = Batcher(run_batch, executor, tasks.add, max_batches=1,
                              weigh=lambda item: item[1], max_batch_weight=4 * MIB)
            loop = asyncio.get_running_loop()
            done: list[asyncio.Future[Any]] = []
            for name, size in (("first", 10), ("big-1", 4 * MIB), ("big-2", 4 * MIB), ("big-3", 4 * MIB)):
                future = loop.create_future()
                done.append(future)

                def on_done(outcome: Any, future: asyncio.Future[Any] = future) -> None:
                    answered_on.append(threading.current_thread())
                    future.set_result(outcome)

                batcher.submit((name, size), on_done, "one connection")
            release.set()
            answers = list(await asyncio.gather(*done))
            await asyncio.gather(*tasks)  # the drain's task ends with it
            return answers, executor.handed, batcher.running

    answers, handed, running = asyncio.run(scenario())
    assert answers == ["first", "big-1", "big-2", "big-3"]  # three batches: the big ones one each
    assert handed == 1
    assert running == 0
    assert answered_on == loop_thread * 4


def test_a_batcher_serves_the_loop_that_runs_it_after_an_earlier_one_closed() -> None:
    with ThreadPoolExecutor(1) as executor:
        batcher = Batcher(lambda items: [item * 2 for item in items], executor, lambda _: None)

        async def one(item: int) -> Any:
            answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            batcher.submit(item, answer.set_result)
            return await asyncio.wait_for(answer, 10)

        assert asyncio.run(one(1)) == 2
        assert asyncio.run(one(2)) == 4  # a new loop: its answer comes back on it


def _run_with_few_on_loop(groups: list[list[tuple[str, int]]]) -> tuple[list[Any], list[tuple[list[str], bool]], int]:
    """Submit each group of items in one loop iteration (the next group after the answers
    of the one before), with ``on_loop_up_to=2``: the answers, each batch with whether it
    ran on the loop's thread, and how many drains went to the executor."""
    batches: list[tuple[list[str], bool]] = []
    loop_thread: list[threading.Thread] = []

    def run_batch(items: list[tuple[str, int]]) -> list[str]:
        batches.append(([name for name, _ in items], threading.current_thread() in loop_thread))
        return [name for name, _ in items]

    async def scenario() -> tuple[list[Any], int]:
        tasks: set[asyncio.Future[None]] = set()
        loop_thread.append(threading.current_thread())
        answers: list[Any] = []
        with CountingExecutor(2) as executor:
            batcher = Batcher(run_batch, executor, tasks.add, max_batches=2, weigh=lambda item: item[1],
                              max_batch_weight=4 * MIB, on_loop_up_to=2)
            loop = asyncio.get_running_loop()
            for group in groups:
                done = []
                for name, size in group:
                    future = loop.create_future()
                    done.append(future)
                    batcher.submit((name, size), future.set_result, name)
                answers += await asyncio.gather(*done)
            await asyncio.gather(*tasks)
            assert batcher.running == 0
            return answers, executor.handed

    answers, handed = asyncio.run(scenario())
    return answers, batches, handed


def test_a_lone_light_write_runs_on_the_loop_without_a_hand_off() -> None:
    answers, batches, handed = _run_with_few_on_loop([[("one", 10)], [("two", 10)], [("three", 10)]])
    assert answers == ["one", "two", "three"]
    assert batches == [(["one"], True), (["two"], True), (["three"], True)]
    assert handed == 0


def test_more_writes_arriving_together_share_a_drain_and_a_heavy_one_leaves_the_loop() -> None:
    answers, batches, handed = _run_with_few_on_loop(
        [[("a", 10), ("b", 10), ("c", 10)], [("d", 10), ("e", 10)], [("big", 2 * MIB)], [("f", 10), ("big2", 2 * MIB)],
         [("after", 10)]])
    assert answers == ["a", "b", "c", "d", "e", "big", "f", "big2", "after"]
    assert batches == [(["a", "b", "c"], False), (["d", "e"], True), (["big"], False), (["f", "big2"], False),
                       (["after"], True)]
    assert handed == 3
