"""Checkers the broker ships: check-backs sent to a connected producer of the group, and
the configured checker (e.g. the Celery checker) for a group with none connected."""

from __future__ import annotations

import itertools
import logging
import threading

from .api import CheckCallback, TransactionChecker
from .message import CheckRequest

log = logging.getLogger(__name__)


class ProducerCallbackChecker:
    """RocketMQ's way: route a check to a live producer of the group (round-robin).

    Producers offer themselves with ``BrokerAPI.register_producer``; over TCP the callback
    pushes CHECK_TRANSACTION_STATE on that producer's connection.
    """

    def __init__(self) -> None:
        self._callbacks: dict[str, list[CheckCallback]] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def register(self, producer_group: str, callback: CheckCallback) -> None:
        with self._lock:
            self._callbacks.setdefault(producer_group, []).append(callback)

    def unregister(self, producer_group: str, callback: CheckCallback) -> None:
        with self._lock:
            callbacks = self._callbacks.get(producer_group, [])
            if callback in callbacks:
                callbacks.remove(callback)

    def request_check(self, request: CheckRequest) -> bool:
        with self._lock:
            callbacks = list(self._callbacks.get(request.producer_group, ()))
        if not callbacks:
            return False
        start = next(self._turn)
        for n in range(len(callbacks)):
            callback = callbacks[(start + n) % len(callbacks)]
            try:
                callback(request)
                return True
            except Exception:
                log.exception("producer callback of group %s failed", request.producer_group)
        return False


class ProducersFirst:
    """A check goes to a connected producer of its group (``producers``); when none takes
    it, to ``fallback`` (e.g. the Celery checker: it answers when no producer of the group
    is alive). No route when neither takes it."""

    def __init__(self, producers: ProducerCallbackChecker, fallback: TransactionChecker) -> None:
        self.producers = producers
        self.fallback = fallback

    def request_check(self, request: CheckRequest) -> bool:
        return self.producers.request_check(request) or self.fallback.request_check(request)
