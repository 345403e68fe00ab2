"""The combiner's pending pool (workers/combiner/pending.py): loaded once, kept in memory, changes written after each
window; Redis down means an empty pool for now and the writes retried with the next window's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from combee.corroborate import Corroboration, corroborate
from combee.models import AddOp, Playbook
from workers.combiner.pending import keep_pending, pending_pool
from workers.tenure import Combining, Tenure


class FakeStore:
    def __init__(self) -> None:
        self.rows: dict[str, Any] = {}
        self.down = False
        self.reads = 0

    async def entries(self, namespace: str) -> list[Any]:
        self.reads += 1
        if self.down:
            raise ConnectionError("redis down")
        return sorted(self.rows.values(), key=lambda e: (e.supported_at, e.id))

    async def save(self, namespace: str, write: Any, delete: Any) -> None:
        if self.down:
            raise ConnectionError("redis down")
        self.rows.update({e.id: e for e in write})
        for key in delete:
            self.rows.pop(key, None)


def _window(pool: Any, trace: str, window: str) -> Any:
    op = AddOp(section="formulas", content="Divide net income by revenue for the net margin.", sources=(trace,))
    return corroborate((op,), pool, Playbook(namespace="ns"), Corroboration(min_traces=3), window_id=window, at=1.0)


def test_the_pool_is_loaded_once_and_written_after_each_window() -> None:
    store = FakeStore()
    ctx: Any = SimpleNamespace(pending=store)
    state = Combining("ns", Tenure(partition=0, epoch=0, owner="w"))

    async def run() -> None:
        first = _window(await pending_pool(ctx, state), "t1", "w1")
        await keep_pending(ctx, state, first)
        assert [e.traces for e in store.rows.values()] == [("t1",)]
        store.down = True  # the second window's change stays in memory, written with the third's
        second = _window(await pending_pool(ctx, state), "t2", "w2")
        await keep_pending(ctx, state, second)
        assert [e.traces for e in store.rows.values()] == [("t1",)] and state.pending_unsaved
        store.down = False
        third = _window(await pending_pool(ctx, state), "t3", "w3")
        assert len(third.ops) == 1  # three teachers: live
        await keep_pending(ctx, state, third)
        assert store.rows == {} and not state.pending_unsaved and store.reads == 1

    asyncio.run(run())


def test_a_pool_that_cannot_be_read_is_empty_for_now_and_read_again_later() -> None:
    store = FakeStore()
    ctx: Any = SimpleNamespace(pending=store)
    state = Combining("ns", Tenure(partition=0, epoch=0, owner="w"))

    async def run() -> None:
        await keep_pending(ctx, state, _window((), "t1", "w1"))  # written while the pool was never loaded
        store.down = True
        assert await pending_pool(ctx, state) == () and state.pending is None
        store.down = False
        (entry,) = await pending_pool(ctx, state)
        assert entry.traces == ("t1",) and store.reads == 2

    asyncio.run(run())
