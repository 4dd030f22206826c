"""A bounded buffer between what a sandbox writes and one stream that sends it on.

A command's output, or a watcher's events, are read from the sandbox only as fast as
every stream listening to them takes them: :meth:`Outlet.put` waits while the outlet holds
``capacity`` items, so a client that does not read stops the reading, the pipe from the
sandbox fills, and the writer inside blocks. Nothing the sandbox writes can grow the
agent by more than ``capacity`` items per stream. The last item (a command's end) is
always taken, so that a stream never waits for an end that cannot be delivered.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

Item = TypeVar("Item")
CAPACITY = 16  # items: a command's output arrives in pieces of up to 64 KiB


class Outlet(Generic[Item]):
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._items: deque[Item] = deque()
        self._capacity = capacity
        self._taken = asyncio.Event()  # set when an item was taken, or the outlet closed
        self._added = asyncio.Event()
        self.closed = False

    async def put(self, item: Item) -> None:
        """Add ``item`` once there is room; dropped if the stream has gone (``close``)."""
        while len(self._items) >= self._capacity and not self.closed:
            self._taken.clear()
            await self._taken.wait()
        if not self.closed:
            self._items.append(item)
            self._added.set()

    def put_last(self, item: Item) -> None:
        """Add the last item at once, room or not: nothing is put after it."""
        self._items.append(item)
        self._added.set()

    async def get(self) -> Item:
        while not self._items:
            self._added.clear()
            await self._added.wait()
        item = self._items.popleft()
        self._taken.set()
        return item

    def close(self) -> None:
        """The stream has gone: whoever waits to put stops waiting."""
        self.closed = True
        self._items.clear()
        self._taken.set()
