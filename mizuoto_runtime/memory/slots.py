"""Device slots: how many requests hold a device at once (M8, M60).

`compute.gpu_jobs = N` gives each device that moves weights N slots. A request's phase
(`ctx.use` / `ctx.run`) holds one slot of its device from before its components are placed
until its block ends; the next request waits for a free slot — checking its cancel check
every half second, for at most the manager's wait bound (10 minutes, M8) — and then tries
anyway, over the limit, with a warning. Between phases a request holds no slot.

Slots are per thread: phases nested on one thread (another request started inside a phase)
hold the slot they already have, so nesting can never wait on itself.

`exclusive` takes every slot (M60, `JobSpec.exclusive`: a training job owns the device):
it waits until no request holds a slot, and from the moment it starts waiting no new request
gets one (so a stream of requests cannot starve it). While it is held, requests wait; one
that would wait past the bound fails with an error naming the holder, instead of running on a
device another job owns. The holder's own thread may still run phases.

`sole` holds the device alone for a short block (a CUDA Graph capture, M24) only if no other
request holds it now; it never waits for one. Meanwhile requests wait for a slot, as for
`exclusive`.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from ..errors import MizuotoError

log = logging.getLogger(__name__)

_POLL_S = 0.5  # how often a waiter checks for cancellation


class DeviceSlots:
    """The slots of one device: `capacity()` shared holders, or one exclusive holder."""

    def __init__(self, name: str, capacity: Callable[[], int]) -> None:
        self.name = name
        self.capacity = capacity
        self._cond = threading.Condition()
        self._held: dict[int, int] = {}  # thread id -> nesting depth (shared holders)
        self._exclusive: tuple[int, str] | None = None  # (thread id, who)
        self._exclusive_waiting = 0
        self._started = 0  # phases that took a slot (not nested ones): see `alone`

    # ---- shared: one request's phase --------------------------------------------------------
    def take(self, cancel_check: Callable[[], None] | None, timeout_s: float) -> None:
        """Hold a slot for the calling thread (again, if it holds one: nesting)."""
        me = threading.get_ident()
        with self._cond:
            if me in self._held:
                self._held[me] += 1
                return
            if self._exclusive is not None and self._exclusive[0] == me:
                return  # the exclusive holder's own phases
            deadline = time.monotonic() + timeout_s
            while not self._free():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._give_up()
                    break
                self._cond.wait(timeout=min(remaining, _POLL_S))
                if cancel_check is not None:
                    self._unlocked(cancel_check)
            self._held[me] = 1
            self._started += 1

    def give(self) -> None:
        """Release the calling thread's slot (one nesting level)."""
        me = threading.get_ident()
        with self._cond:
            if self._exclusive is not None and self._exclusive[0] == me and me not in self._held:
                return
            depth = self._held.get(me, 0) - 1
            if depth > 0:
                self._held[me] = depth
                return
            self._held.pop(me, None)
            self._cond.notify_all()

    def holders(self) -> int:
        """Requests (threads) holding a slot now; an exclusive holder counts as every slot."""
        with self._cond:
            return self.capacity() if self._exclusive is not None else len(self._held)

    def alone(self) -> int | None:
        """None while a request on another thread holds the device (or waits to own it); else
        how many phases have taken a slot so far. The same mark at a phase's start and end means
        no other request ran on the device meanwhile (M47 measures a phase only then: the
        allocator's peak is the device's, not the request's)."""
        me = threading.get_ident()
        with self._cond:
            others = [t for t in self._held if t != me]
            owner = self._exclusive is not None and self._exclusive[0] != me
            return None if others or owner or self._exclusive_waiting else self._started

    def _free(self) -> bool:
        return (self._exclusive is None and not self._exclusive_waiting
                and len(self._held) < max(1, self.capacity()))

    def _give_up(self) -> None:
        if self._exclusive is not None or self._exclusive_waiting:
            who = self._exclusive[1] if self._exclusive is not None else "an exclusive job"
            raise MizuotoError(f"device {self.name} is held exclusively by {who}; gave up waiting for it")
        log.warning("waited for a free slot of device %s (compute.gpu_jobs=%d); trying anyway",
                    self.name, self.capacity())

    def _unlocked(self, fn: Callable[[], None]) -> None:
        """Run `fn` (a cancel check, which may raise) without holding the lock."""
        self._cond.release()
        try:
            fn()
        finally:
            self._cond.acquire()

    # ---- exclusive: a job that owns the device (M60) ----------------------------------------
    @contextlib.contextmanager
    def exclusive(self, who: str, cancel_check: Callable[[], None] | None, timeout_s: float) -> Iterator[None]:
        """Hold every slot for the block (see the module docstring)."""
        me = threading.get_ident()
        with self._cond:
            if me in self._held or (self._exclusive is not None and self._exclusive[0] == me):
                raise MizuotoError(f"{who}: cannot take device {self.name} exclusively from inside a phase on it")
            self._exclusive_waiting += 1
            try:
                deadline = time.monotonic() + timeout_s
                while self._held or self._exclusive is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise MizuotoError(f"{who}: device {self.name} is still used by {self._users()}; "
                                           "gave up waiting to take it exclusively")
                    self._cond.wait(timeout=min(remaining, _POLL_S))
                    if cancel_check is not None:
                        self._unlocked(cancel_check)
            finally:
                self._exclusive_waiting -= 1
                self._cond.notify_all()
            self._exclusive = (me, who)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = None
                self._cond.notify_all()

    @contextlib.contextmanager
    def sole(self, who: str) -> Iterator[bool]:
        """Yield True, holding the device alone for the block, when no request on another
        thread holds or awaits it; else yield False at once (nothing held)."""
        me = threading.get_ident()
        with self._cond:
            others = any(t != me for t in self._held)
            owner = self._exclusive is not None and self._exclusive[0] != me
            if others or owner or self._exclusive_waiting:
                alone = False
            else:
                alone, previous = True, self._exclusive
                self._exclusive = (me, who)
        if not alone:
            yield False
            return
        try:
            yield True
        finally:
            with self._cond:
                self._exclusive = previous
                self._cond.notify_all()

    def _users(self) -> str:
        if self._exclusive is not None:
            return self._exclusive[1]
        return f"{len(self._held)} request(s)"
