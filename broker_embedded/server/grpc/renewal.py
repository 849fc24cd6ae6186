"""The messages push consumers hold, kept invisible until they are settled.

A push consumer receives with ``auto_renew`` (and no invisible duration): the server is to keep
each message invisible while the client's listener works on it, as RocketMQ's proxy does. A
held message's invisibility is extended shortly before it ends, by the same duration each
time, for at most ``MAX_HOLD_S``. The renewals keep the receipt handle the client holds
(``keep_receipt``), so its ack and its ChangeInvisibleDuration take that handle as it is,
even after a restart of the broker emptied this front's memory (RocketMQ's proxy maps the
client's handle to the broker's newest in its memory: a restart loses the map and the
client's handle with it). A message stops being held when it is settled, when its client ends
(NotifyClientTermination, or ``GONE_AFTER_S`` without a sign of life after its Telemetry stream
closed: its messages are then visible again within ``RELEASED_INVISIBLE_S``, as RocketMQ's
proxy clears a client gone offline: after the renewal in flight, if any, so that it cannot
land last), or after ``MAX_HOLD_S``, when it comes back once its current invisible duration
ends. A renewal the broker refuses for a passing reason (a full disk) is tried again every
``RETRY_S`` while the message is still invisible; one whose receipt is gone (settled,
expired) ends the hold. The front's own stop releases nothing: the broker keeps the receipts
across a restart, so the client may still ack with them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ...errors import BrokerClosedError, UnknownReceiptError

log = logging.getLogger(__name__)

#: The longest a message is kept invisible for a push consumer (RocketMQ's proxy: 3 h).
MAX_HOLD_S = 3 * 3600.0

#: How soon the messages of a client that ended are visible again (RocketMQ's proxy:
#: ``invisibleTimeMillisWhenClear``).
RELEASED_INVISIBLE_S = 1.0

#: How soon a renewal the broker could not take for a passing reason is tried again.
RETRY_S = 1.0

#: How long a client whose Telemetry stream closed may give no sign of life (a Heartbeat: the
#: official clients send one every 10 s; a new Telemetry stream; a receive) before it counts
#: as gone. A stream also closes under a live client (a proxy or load balancer resetting it;
#: the client opens another at its next settings sync), whose messages stay held meanwhile.
GONE_AFTER_S = 30.0

#: ``renew(group, receipt_handle, invisible_duration_s)``: invisible that long from now, the
#: receipt handle kept.
Renew = Callable[[str, str, float], Awaitable[object]]


@dataclass(eq=False)
class Held:
    """A message a push consumer holds, by the receipt handle it was given."""

    group: str
    client_id: str
    handle: str
    renew_at: float
    held_until: float
    #: When its current invisible duration ends (the loop's clock).
    visible_at: float
    #: The renewal in flight, if any (``Renewals._renew``).
    renewal: asyncio.Future[object] | None = field(default=None, repr=False)


class Renewals:
    """The held messages of every push consumer, renewed by ``run`` (one event loop's)."""

    def __init__(self, renew: Renew, invisible_s: float, gone_after_s: float = GONE_AFTER_S) -> None:
        self.renew = renew
        self.invisible_s = invisible_s
        self.gone_after_s = gone_after_s
        #: Renewed this long before the invisibility ends (a third of it: a slow broker call
        #: or a busy loop still renews in time).
        self.ahead_s = invisible_s / 3
        self._held: dict[tuple[str, str], Held] = {}  # (group, the client's handle) -> held
        #: The releases of ended clients' messages under way (``end_client``).
        self._releasing: set[asyncio.Task[None]] = set()
        #: Clients whose Telemetry stream closed: when each counts as gone (``detach``).
        self._detached: dict[str, float] = {}

    def hold(self, client_id: str, group: str, handle: str) -> None:
        """``client_id`` received ``handle`` with ``auto_renew`` (invisible for ``invisible_s``)."""
        self.seen(client_id)
        now = asyncio.get_running_loop().time()
        self._held[(group, handle)] = Held(group, client_id, handle, now + self.invisible_s - self.ahead_s,
                                           now + MAX_HOLD_S, now + self.invisible_s)

    def settle(self, group: str, handle: str) -> None:
        """Stop renewing ``handle`` (the client acks it, changes its invisibility or sends it
        to the DLQ). A renewal in flight may still land before that request or be refused
        after it: either way the client's request decides."""
        self._held.pop((group, handle), None)

    def detach(self, client_id: str) -> None:
        """The client's Telemetry stream closed: its messages are still renewed, and released
        (``end_client``) if it gives no sign of life (``seen``) for ``gone_after_s``."""
        self._detached[client_id] = asyncio.get_running_loop().time() + self.gone_after_s

    def seen(self, client_id: str) -> None:
        """A sign of life of the client (a Heartbeat, a Telemetry stream, a receive)."""
        self._detached.pop(client_id, None)

    def end_client(self, client_id: str, release: bool = True) -> int:
        """The client ended: stop renewing its messages and, with ``release``, make them
        visible again in ``RELEASED_INVISIBLE_S`` (in a task of the loop); without, they come
        back when their invisible duration ends. How many it held."""
        self._detached.pop(client_id, None)
        ended = [self._held.pop(key) for key in
                 [key for key, held in self._held.items() if held.client_id == client_id]]
        if release and ended:
            task = asyncio.get_running_loop().create_task(self._release(ended))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)
        return len(ended)

    async def _release(self, ended: list[Held]) -> None:
        outcomes = await asyncio.gather(*(self._release_one(held) for held in ended), return_exceptions=True)
        for held, outcome in zip(ended, outcomes, strict=True):
            if isinstance(outcome, BaseException):  # settled meanwhile, or expired: nothing to release
                log.debug("releasing a message of group %s failed: %s", held.group, outcome)

    async def _release_one(self, held: Held) -> None:
        if held.renewal is not None:  # landing after the release, it would hide the message again
            await asyncio.wait((held.renewal,))  # its outcome is ``_renew``'s
        await self.renew(held.group, held.handle, RELEASED_INVISIBLE_S)

    async def run(self, tick_s: float) -> None:
        """Every ``tick_s``, end the clients gone and renew what is due, until cancelled
        (which cancels the releases under way too)."""
        try:
            while True:
                await asyncio.sleep(tick_s)
                self.end_gone()
                await self.renew_due()
        finally:
            for task in list(self._releasing):
                task.cancel()

    def end_gone(self) -> None:
        """``end_client`` each detached client whose ``gone_after_s`` is over."""
        now = asyncio.get_running_loop().time()
        for client_id in [client_id for client_id, gone_at in self._detached.items() if gone_at <= now]:
            if released := self.end_client(client_id):
                log.info("gRPC client %s gave no sign of life for %gs since its Telemetry stream closed: "
                         "its %d held messages are released", client_id, self.gone_after_s, released)

    async def renew_due(self) -> None:
        now = asyncio.get_running_loop().time()
        due = [(key, held) for key, held in self._held.items() if held.renew_at <= now]
        await asyncio.gather(*(self._renew(key, held, now) for key, held in due))

    async def _renew(self, key: tuple[str, str], held: Held, now: float) -> None:
        if self._held.get(key) is not held:
            return  # settled or forgotten meanwhile
        if now >= held.held_until:
            del self._held[key]
            log.info("message of group %s held by client %s for %gs: no longer renewed", held.group,
                     held.client_id, MAX_HOLD_S)
            return
        held.renew_at = float("inf")  # not due again while this renewal is in flight
        held.renewal = asyncio.ensure_future(self.renew(held.group, held.handle, self.invisible_s))
        try:
            await held.renewal
        except (UnknownReceiptError, BrokerClosedError) as exc:  # settled, expired or gone: nothing to renew
            self._forget(key, held)
            log.debug("renewing a message of group %s failed: %s", held.group, exc)
            return
        except Exception as exc:  # a full disk, say: again while the message is still invisible
            if self._held.get(key) is not held:
                return  # settled or released meanwhile
            retry_at = asyncio.get_running_loop().time() + RETRY_S
            if retry_at >= held.visible_at:
                self._forget(key, held)
                log.warning("renewing a message of group %s failed: %s; no longer renewed", held.group, exc)
                return
            held.renew_at = retry_at
            log.warning("renewing a message of group %s failed, trying again in %gs: %s", held.group, RETRY_S, exc)
            return
        held.visible_at = now + self.invisible_s
        held.renew_at = held.visible_at - self.ahead_s

    def _forget(self, key: tuple[str, str], held: Held) -> None:
        if self._held.get(key) is held:
            del self._held[key]
