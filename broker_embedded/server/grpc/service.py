"""``apache.rocketmq.v2.MessagingService`` over the broker core, on ``grpc.aio``.

The handlers are registered by hand under the service's wire name (the protos are compiled
under a private package, see ``_proto/README.md``). Every broker call runs on the
front's executor threads, as the native server's do: writes in flight together share one
append and one fsync, and acks arriving together one hop and one ``ack_many`` per group,
through the native server's batchers. Producer RPCs (normal, FIFO, delay and
transactional sends, EndTransaction, check-backs over Telemetry), SimpleConsumer RPCs
(ReceiveMessage, AckMessage, ChangeInvisibleDuration) and PushConsumer RPCs (QueryAssignment,
the subscription settings over Telemetry, ForwardMessageToDeadLetterQueue) are served, and
RecallMessage (a delayed message's SendResultEntry carries its ``recall_handle``); the others
answer UNIMPLEMENTED. Priority messages keep their priority, and a receive hands out its
higher priorities first; lite messages are refused (UNSUPPORTED).

Push consumers are told their group is not FIFO (``Subscription.fifo`` false), unless it is
one of ``fifo_groups`` (RocketMQ's ``consumeMessageOrderly`` group setting). A concurrent one
answers a failed message with ChangeInvisibleDuration (the back-off of the settings), and
retries and the DLQ are the broker's (``max_delivery_attempts``). A FIFO one retries a failed
message itself, in place, with that back-off and attempts, then forwards it to the DLQ
(ForwardMessageToDeadLetterQueue: the broker's ``dead_letter``). Either way order within a
message group is the broker's own, which delivers one message of a group at a time, the next
once the previous is acked or dead-lettered. The messages they receive stay invisible until
settled (``auto_renew``, see ``renewal``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from ...api import MAX_DURATION_S, BrokerAPI
from ...broker.config import BrokerConfig
from ...broker.writes import EndCall, HalfCall, SendCall, WriteCall
from ...errors import InvalidMessageError, UnknownTopicError
from ...filters import SQL92, TAG, parse_filter
from ...message import ReceivedMessage, Resolution
from ...wire.auth import RateLimitedLog
from ..batching import Batcher, ack_batcher, write_batcher
from ._proto import definition_pb2 as pb
from ._proto import service_pb2 as spb
from .convert import from_proto, priority_of, received_to_proto
from .renewal import GONE_AFTER_S, Renewals
from .sessions import CheckRouter, TelemetrySession
from .status import ok, status_of

log = logging.getLogger(__name__)

SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
#: The message types every queue accepts (a topic here is not bound to one type). LITE is
#: listed so that a lite message reaches the broker and is refused with UNSUPPORTED and a
#: reason, rather than by the client with a message-type mismatch.
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION, pb.PRIORITY, pb.LITE)
#: The lite topic length the lite consumers are told (their own check, before the broker refuses
#: lite subscriptions: RocketMQ's proxy default).
LITE_TOPIC_MAX_LENGTH = 64
#: The longest a receive may wait for messages (RocketMQ's proxy clamps to 20 s as well).
MAX_LONG_POLL_S = 20.0
#: A waiting receive looks at the broker at least this often (to notice a stopping server).
POLL_SLICE_S = 1.0
DEFAULT_INVISIBLE_S = 30.0
#: Messages a push consumer asks for in one receive (RocketMQ's proxy default as well).
PUSH_BATCH_SIZE = 32
#: The long poll of a push consumer's receives: a push consumer's shutdown waits for its receive
#: in flight (the Node client's does), so this bounds it; an idle consumer asks this often.
PUSH_LONG_POLL_S = 5
#: How soon a message comes back when a client makes it visible "now" (a zero invisible
#: duration, which the broker refuses): the Node client's nack without a back-off.
VISIBLE_NOW_S = 0.001
RESOLUTIONS = {pb.COMMIT: Resolution.COMMIT, pb.ROLLBACK: Resolution.ROLLBACK,
               pb.TRANSACTION_RESOLUTION_UNSPECIFIED: Resolution.UNKNOWN}


def _seconds(duration: Any) -> float:
    return float(duration.seconds + duration.nanos / 1e9)


class MessagingService:
    """The RPCs of RocketMQ 5's MessagingService, answering from ``broker``.

    ``advertise`` (``host:port`` each) are the brokers routes name: this one, or every broker
    of a static route (each serving its own store, the same list given to each); without it a
    route names the address the client used. Signatures are checked before the service is
    reached (``signature.SignatureFirst``). A message a push consumer receives is invisible for
    ``push_invisible_s``, renewed while the consumer holds it (``renewals``), and released
    once its client gave no sign of life for ``client_gone_after_s``. Push consumers of
    ``fifo_groups`` consume as FIFO groups (one message of a message group at a time, failures
    retried by the client, then forwarded to the DLQ)."""

    def __init__(self, broker: BrokerAPI, executor: ThreadPoolExecutor, poll_executor: Executor,
                 advertise: Sequence[str] = (), push_invisible_s: float = DEFAULT_INVISIBLE_S,
                 fifo_groups: Collection[str] = (), client_gone_after_s: float = GONE_AFTER_S) -> None:
        self.broker = broker
        self.fifo_groups = frozenset(fifo_groups)
        self.executor = executor
        self.poll_executor = poll_executor
        self.advertise = tuple(advertise)
        self.malformed = RateLimitedLog(log)
        self.router = CheckRouter(broker)
        config = getattr(broker, "config", None)
        self.config = config if isinstance(config, BrokerConfig) else BrokerConfig()
        self.stopping = False
        self.renewals = Renewals(self._renew, push_invisible_s, client_gone_after_s)
        #: Concurrent writes share one append and one fsync (group commit), as on the native port.
        self._tasks: set[asyncio.Future[None]] = set()
        self._writes = write_batcher(broker, executor, self._track)
        #: Acks that arrive together (a push consumer's, or several consumers') share one hop.
        self._acks = ack_batcher(broker, executor, self._track)

    def _track(self, task: asyncio.Future[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _submit(self, batcher: Batcher, item: Any, source: object) -> asyncio.Future[Any]:
        """Queue ``item`` for ``batcher``'s next batch; its outcome (a result or an error),
        on the loop."""
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def on_done(outcome: Any) -> None:
            if not answer.done():  # the call may have been cancelled meanwhile
                answer.set_result(outcome)

        batcher.submit(item, on_done, source)
        return answer

    async def _write(self, call: WriteCall, client_id: str) -> Any:
        """Run a write in the next batch; its result, or its error raised."""
        outcome = await self._submit(self._writes, call, client_id)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(function, *args, **kwargs))

    async def _poll(self, receive: Callable[..., Any], wait_s: float) -> Any:
        """A receive that may wait ``wait_s``, on a poll thread."""
        executor = self.poll_executor if wait_s > 0 else self.executor
        return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(receive, wait_s=wait_s))

    # -- routes, heartbeats ---------------------------------------------------------------
    async def QueryRoute(self, request: spb.QueryRouteRequest, context: Any) -> spb.QueryRouteResponse:
        topic = request.topic.name
        try:
            queues = await self._call(self._queue_count, topic)
        except Exception as exc:
            return spb.QueryRouteResponse(status=status_of(exc))
        return spb.QueryRouteResponse(status=ok(), message_queues=[
            pb.MessageQueue(topic=pb.Resource(name=topic, resource_namespace=request.topic.resource_namespace),
                            id=queue, permission=pb.READ_WRITE, broker=broker, accept_message_types=ACCEPTED_TYPES)
            for broker in self._brokers(request.endpoints) for queue in range(queues)])

    def _brokers(self, asked_via: pb.Endpoints) -> list[pb.Broker]:
        """The brokers of a route: the advertised ones, else this one at the address asked."""
        return ([pb.Broker(name=address, id=0, endpoints=_endpoints(address)) for address in self.advertise]
                or [pb.Broker(name="halfmoon", id=0, endpoints=asked_via)])

    async def QueryAssignment(self, request: spb.QueryAssignmentRequest,
                              context: Any) -> spb.QueryAssignmentResponse:
        """A push consumer's share of a topic: every broker of the route, each as queue -1
        (all its queues), as RocketMQ's proxy assigns a non-FIFO group: each broker spreads
        its messages over the group's consumers itself."""
        try:
            await self._call(self._queue_count, request.topic.name)
        except Exception as exc:
            return spb.QueryAssignmentResponse(status=status_of(exc))
        return spb.QueryAssignmentResponse(status=ok(), assignments=[
            pb.Assignment(message_queue=pb.MessageQueue(topic=request.topic, id=-1, permission=pb.READ_WRITE,
                                                        broker=broker, accept_message_types=ACCEPTED_TYPES))
            for broker in self._brokers(request.endpoints)])

    def _queue_count(self, topic: str) -> int:
        for info in self.broker.list_topics():
            if info.name == topic:
                return info.queues
        if not self.config.auto_create_topics:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return self.broker.create_topic(topic).queues

    async def Heartbeat(self, request: spb.HeartbeatRequest, context: Any) -> spb.HeartbeatResponse:
        self.renewals.seen(_client_id(context))
        return spb.HeartbeatResponse(status=ok())

    async def NotifyClientTermination(self, request: spb.NotifyClientTerminationRequest,
                                      context: Any) -> spb.NotifyClientTerminationResponse:
        self.renewals.end_client(_client_id(context), release=not self.stopping)
        return spb.NotifyClientTerminationResponse(status=ok())

    # -- producing ------------------------------------------------------------------------
    async def SendMessage(self, request: spb.SendMessageRequest, context: Any) -> spb.SendMessageResponse:
        client_id = _client_id(context)
        entries = [await self._send_one(message, client_id) for message in request.messages]
        if not entries:
            return spb.SendMessageResponse(status=pb.Status(code=pb.BAD_REQUEST, message="no message to send"))
        failed = [entry.status for entry in entries if entry.status.code != pb.OK]
        return spb.SendMessageResponse(status=failed[0] if failed else ok(), entries=entries)

    async def _send_one(self, sent: pb.Message, client_id: str) -> spb.SendResultEntry:
        try:
            message = from_proto(sent)
            kind = sent.system_properties.message_type
            if kind == pb.TRANSACTION:
                topic = message.topic  # the producer group is the topic, as RocketMQ's proxy has it
                self.router.sent_half(message.message_id, client_id)  # before a check can come
                result = await self._write(HalfCall(message, topic, message.message_id), client_id)
            else:
                if kind == pb.FIFO and message.message_group is None:
                    raise InvalidMessageError("a FIFO message needs a message_group")
                result = await self._write(SendCall(message), client_id)
        except Exception as exc:
            return spb.SendResultEntry(status=status_of(exc))
        return spb.SendResultEntry(status=ok(), message_id=result.message_id, offset=result.queue_offset,
                                   transaction_id=result.transaction_id or "",
                                   recall_handle=result.recall_handle or "")

    async def RecallMessage(self, request: spb.RecallMessageRequest, context: Any) -> spb.RecallMessageResponse:
        """Take a delayed message back before it is due (the broker's ``recall``): BAD_REQUEST
        for a handle the broker did not issue for the topic, or a message delivered already."""
        try:
            message_id = await self._call(self.broker.recall, request.topic.name, request.recall_handle)
        except Exception as exc:
            return spb.RecallMessageResponse(status=status_of(exc))
        return spb.RecallMessageResponse(status=ok(), message_id=message_id)

    async def EndTransaction(self, request: spb.EndTransactionRequest, context: Any) -> spb.EndTransactionResponse:
        transaction_id = request.transaction_id or request.message_id
        resolution = RESOLUTIONS.get(request.resolution)
        if resolution is None:
            return spb.EndTransactionResponse(status=pb.Status(
                code=pb.BAD_REQUEST, message=f"unknown transaction resolution {request.resolution}"))
        try:
            await self._write(EndCall(transaction_id, resolution, request.topic.name,
                                      from_check=request.source == pb.SOURCE_SERVER_CHECK), _client_id(context))
        except Exception as exc:
            return spb.EndTransactionResponse(status=status_of(exc))
        if resolution is not Resolution.UNKNOWN:
            self.router.ended(transaction_id)
        return spb.EndTransactionResponse(status=ok())

    async def Telemetry(self, requests: AsyncIterator[spb.TelemetryCommand], context: Any) -> None:
        """The client's settings are answered (status OK, the publishing limits); check-backs
        of the topics it publishes are written to it while the stream is open."""
        session = TelemetrySession(_client_id(context), asyncio.get_running_loop())
        self.router.open(session)
        self.renewals.seen(session.client_id)
        reading = asyncio.create_task(self._read_telemetry(requests, session))
        try:
            while (command := await session.outgoing.get()) is not None:
                await context.write(command)
        finally:
            reading.cancel()
            self.router.close(session)
            if self.stopping:  # it ends every stream: nothing released, the client may ack after a restart
                self.renewals.end_client(session.client_id, release=False)
            elif not self.router.connected(session.client_id):  # no newer stream of the client
                self.renewals.detach(session.client_id)

    async def _read_telemetry(self, requests: AsyncIterator[spb.TelemetryCommand], session: TelemetrySession) -> None:
        try:
            async for command in requests:
                if command.WhichOneof("command") == "settings":
                    settings = command.settings
                    if settings.HasField("publishing"):
                        self.router.publish(session, frozenset(t.name for t in settings.publishing.topics))
                    session.outgoing.put_nowait(spb.TelemetryCommand(status=ok(), settings=self._settings(settings)))
        except Exception as exc:  # the client went away
            log.debug("telemetry stream of %s ended: %s", session.client_id, exc)
        finally:
            session.outgoing.put_nowait(None)

    def _settings(self, asked: pb.Settings) -> pb.Settings:
        """The settings reply: the client's own, with the broker's publishing limits or the
        subscription a consumer is to follow."""
        settings = pb.Settings()
        settings.CopyFrom(asked)
        settings.metric.CopyFrom(pb.Metric(on=False))
        if asked.HasField("publishing"):
            settings.publishing.max_body_size = self.config.max_body_size
            settings.publishing.validate_message_type = True
            policy = settings.backoff_policy
            policy.max_attempts = 3
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromMilliseconds(1000)
            policy.exponential_backoff.multiplier = 2.0
        elif asked.HasField("subscription"):
            self._subscription_settings(settings)
        return settings

    def _subscription_settings(self, settings: pb.Settings) -> None:
        """What a push consumer follows (a simple consumer ignores it): concurrent consumption
        (FIFO for ``fifo_groups``), a short long poll, and the broker's retry schedule as the
        back-off of a failed message, in whole seconds (the Python client reads only the
        seconds), with the broker's ``max_delivery_attempts``. The Node client reads only an
        exponential back-off: a Node consumer of a FIFO group, which retries by that policy
        itself, gets one from the first to the last of the schedule (without it, it would
        forward a failed message to the DLQ at once)."""
        subscription = settings.subscription
        if settings.client_type in (pb.LITE_PUSH_CONSUMER, pb.LITE_SIMPLE_CONSUMER):
            # limits the clients check before they subscribe: their SyncLiteSubscription then
            # reaches the broker and is answered UNIMPLEMENTED, saying so
            subscription.max_lite_topic_size = LITE_TOPIC_MAX_LENGTH
            subscription.lite_subscription_quota = 1
        subscription.fifo = subscription.group.name in self.fifo_groups
        subscription.receive_batch_size = PUSH_BATCH_SIZE
        long_poll_s = min(_seconds(subscription.long_polling_timeout), MAX_LONG_POLL_S) or PUSH_LONG_POLL_S
        subscription.long_polling_timeout.FromMilliseconds(int(long_poll_s * 1000))
        policy = settings.backoff_policy
        policy.max_attempts = self.config.max_delivery_attempts
        delays_s = [max(1, math.ceil(delay_s)) for delay_s in self.config.retry_backoff_s] or [1]
        if subscription.fifo and settings.user_agent.language == pb.NODE_JS:
            policy.exponential_backoff.initial.FromSeconds(delays_s[0])
            policy.exponential_backoff.max.FromSeconds(delays_s[-1])
            policy.exponential_backoff.multiplier = 2.0
            return
        for delay_s in delays_s:
            policy.customized_backoff.next.add().FromSeconds(delay_s)

    # -- consuming ------------------------------------------------------------------------
    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest,
                             context: Any) -> AsyncIterator[spb.ReceiveMessageResponse]:
        """One status (OK, or MESSAGE_NOT_FOUND when nothing came), then the time of
        delivery (the clients' receive latency is measured from it) and the messages."""
        refused = _refused_filter(request.filter_expression)
        if refused is not None:
            yield spb.ReceiveMessageResponse(status=refused)
            return
        try:
            received, invisible_s = await self._receive(request)
        except Exception as exc:
            yield spb.ReceiveMessageResponse(status=status_of(exc))
            return
        if not received:
            yield spb.ReceiveMessageResponse(status=pb.Status(code=pb.MESSAGE_NOT_FOUND, message="no new message"))
            return
        received.sort(key=_by_priority)
        yield spb.ReceiveMessageResponse(status=ok())
        delivered = spb.ReceiveMessageResponse()
        delivered.delivery_timestamp.GetCurrentTime()
        yield delivered
        for item in received:
            yield spb.ReceiveMessageResponse(message=received_to_proto(item, invisible_s))
        if request.auto_renew:  # written to the client (a receive cut short renews nothing)
            client_id = _client_id(context)
            for item in received:
                self.renewals.hold(client_id, request.group.name, item.receipt_handle)

    async def _receive(self, request: spb.ReceiveMessageRequest) -> tuple[list[Any], float]:
        if request.auto_renew:
            invisible_s = self.renewals.invisible_s  # renewed while held: the client's asking aside
        elif request.HasField("invisible_duration"):
            invisible_s = _seconds(request.invisible_duration)
        else:
            invisible_s = DEFAULT_INVISIBLE_S
        if not 0 < invisible_s <= MAX_DURATION_S:
            raise InvalidMessageError(f"invisible duration {invisible_s:g}s is not in (0, {MAX_DURATION_S:g}]")
        wait_s = min(MAX_LONG_POLL_S, max(0.0, _seconds(request.long_polling_timeout)))
        receive = functools.partial(self.broker.receive, request.group.name, request.message_queue.topic.name,
                                    max_messages=max(1, min(request.batch_size or 32, 1024)),
                                    invisible_duration_s=invisible_s,
                                    filter_expression=request.filter_expression.expression,
                                    filter_type=_filter_type(request.filter_expression))
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            received = await self._poll(receive, max(0.0, min(POLL_SLICE_S, left)))
            if received or left <= POLL_SLICE_S or self.stopping:
                return received, invisible_s

    async def AckMessage(self, request: spb.AckMessageRequest, context: Any) -> spb.AckMessageResponse:
        group = request.group.name
        for entry in request.entries:
            self.renewals.settle(group, entry.receipt_handle)
        # one batch for the request's entries (and the acks of other calls arriving with them):
        # one ack_many per group, one lock and one consumer-state write
        acked = [self._submit(self._acks, {"group": group, "receipt_handle": entry.receipt_handle}, None)
                 for entry in request.entries]
        entries = [spb.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                             status=ok() if outcome is None else status_of(outcome))
                   for entry, outcome in zip(request.entries, [await ack for ack in acked], strict=True)]
        failed = [entry.status for entry in entries if entry.status.code != pb.OK]
        return spb.AckMessageResponse(status=failed[0] if failed else ok(), entries=entries)

    async def ChangeInvisibleDuration(self, request: spb.ChangeInvisibleDurationRequest,
                                      context: Any) -> spb.ChangeInvisibleDurationResponse:
        try:
            self.renewals.settle(request.group.name, request.receipt_handle)
            handle = str(await self._call(self.broker.change_invisible_duration, request.group.name,
                                          request.receipt_handle, _seconds(request.invisible_duration) or VISIBLE_NOW_S))
        except Exception as exc:
            return spb.ChangeInvisibleDurationResponse(status=status_of(exc))
        return spb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)

    async def ForwardMessageToDeadLetterQueue(self, request: spb.ForwardMessageToDeadLetterQueueRequest,
                                              context: Any) -> spb.ForwardMessageToDeadLetterQueueResponse:
        """The message of a receipt to the group's DLQ now (the broker's ``dead_letter``):
        OK again for one forwarded already (the clients retry until OK),
        INVALID_RECEIPT_HANDLE for a receipt not in flight."""
        try:
            self.renewals.settle(request.group.name, request.receipt_handle)
            await self._call(self.broker.dead_letter, request.group.name, request.receipt_handle)
        except Exception as exc:
            return spb.ForwardMessageToDeadLetterQueueResponse(status=status_of(exc))
        return spb.ForwardMessageToDeadLetterQueueResponse(status=ok())

    async def _renew(self, group: str, receipt_handle: str, invisible_s: float) -> object:
        """A held message's renewal (``renewals``): its receipt handle stays the client's."""
        return await self._call(self.broker.change_invisible_duration, group, receipt_handle, invisible_s,
                                keep_receipt=True)

    # -- the service ----------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        """The service's handlers under its wire name, built from the service descriptor:
        every RPC this class does not define answers UNIMPLEMENTED. Requests arrive as bytes
        and are decoded by ``_guarded`` (grpcio would log a traceback for each undecodable one)."""
        handlers = {}
        for method in spb.DESCRIPTOR.services_by_name["MessagingService"].methods:
            implementation = getattr(self, method.name, None) or _unimplemented(method.name)
            request_class = message_factory.GetMessageClass(method.input_type)
            response_class = message_factory.GetMessageClass(method.output_type)
            make = {(False, False): grpc.unary_unary_rpc_method_handler,
                    (False, True): grpc.unary_stream_rpc_method_handler,
                    (True, True): grpc.stream_stream_rpc_method_handler,
                    (True, False): grpc.stream_unary_rpc_method_handler}[
                        (method.client_streaming, method.server_streaming)]
            handlers[method.name] = make(
                self._guarded(implementation, request_class, method.client_streaming, method.server_streaming),
                response_serializer=response_class.SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    def _guarded(self, implementation: Callable[..., Any], request_class: Any, client_streaming: bool,
                 server_streaming: bool) -> Callable[..., Any]:
        """``implementation`` given its request decoded from bytes: one that does not decode
        is answered INVALID_ARGUMENT (one rate-limited log line, no traceback). A streaming
        implementation writes what it yields through the context."""
        malformed = self.malformed

        async def refused(context: Any, error: DecodeError) -> None:
            """Abort the call INVALID_ARGUMENT (``abort`` raises)."""
            malformed.warning("a malformed %s request: %s", request_class.DESCRIPTOR.name, error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the request is not a valid {request_class.DESCRIPTOR.name}")

        async def each_decoded(raws: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
            async for raw in raws:
                try:
                    yield request_class.FromString(raw)
                except DecodeError as exc:  # ends the stream with that status
                    malformed.warning("a malformed %s request: %s", request_class.DESCRIPTOR.name, exc)
                    context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
                    context.set_details(f"a request is not a valid {request_class.DESCRIPTOR.name}")
                    return

        def request_of(raw: Any, context: Any) -> Any:
            """Decoded in the handler's own coroutine, not one of its own: a step less per call."""
            return each_decoded(raw, context) if client_streaming else request_class.FromString(raw)

        async def stream(raw: Any, context: Any) -> None:
            try:
                request = request_of(raw, context)
            except DecodeError as exc:
                await refused(context, exc)
            result = implementation(request, context)
            if hasattr(result, "__aiter__"):
                async for item in result:
                    await context.write(item)
            else:
                await result

        async def unary(raw: Any, context: Any) -> Any:
            try:
                request = request_of(raw, context)
            except DecodeError as exc:
                await refused(context, exc)
            return await implementation(request, context)

        return stream if server_streaming else unary


def _endpoints(address: str) -> pb.Endpoints:
    """The endpoints of ``host:port`` (IPv4, ``[IPv6]`` or a domain name)."""
    host, _, port = address.rpartition(":")
    scheme = pb.IPv4 if host.replace(".", "").isdigit() else pb.IPv6 if ":" in host else pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host.strip("[]"), port=int(port))])


def _filter_type(expression: pb.FilterExpression) -> str:
    """The broker's filter type of a gRPC one (TAG when unspecified)."""
    return SQL92 if expression.type == pb.SQL else TAG


def _refused_filter(expression: pb.FilterExpression) -> pb.Status | None:
    """ILLEGAL_FILTER_EXPRESSION for a filter the broker does not take (a malformed TAG or
    SQL92 expression, another type), before anything is received; None for a good one."""
    if expression.type not in (pb.TAG, pb.SQL, pb.FILTER_TYPE_UNSPECIFIED):
        return pb.Status(code=pb.ILLEGAL_FILTER_EXPRESSION,
                         message=f"filter type {expression.type}: only TAG and SQL92 filters are supported")
    try:
        parse_filter(expression.expression, _filter_type(expression))
    except InvalidMessageError as exc:
        return pb.Status(code=pb.ILLEGAL_FILTER_EXPRESSION, message=f"{type(exc).__name__}: {exc}")
    return None


def _by_priority(item: ReceivedMessage) -> int:
    """The sort key that puts a receive's higher-priority messages first (stable: messages
    of one priority, and those without one, keep the broker's order)."""
    return -(priority_of(item.message) or 0)


def _client_id(context: Any) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


def _unimplemented(name: str) -> Callable[..., Any]:
    async def unimplemented(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            f"{name} is not implemented by halfmoon's broker (Producer, SimpleConsumer and "
                            "PushConsumer RPCs and RecallMessage are)")
    return unimplemented
