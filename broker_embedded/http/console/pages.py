"""The console's pages, each rendered from what the broker knows right now.

Every function takes the broker (or what it read) and a :class:`View` and returns a
:class:`Page`; nothing here changes the broker. Actions render as forms only for a
signed-in operator, each with the session's CSRF token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlencode

from ...api import FORCE_WARNINGS, OpenTransaction
from ...broker.facade import EmbeddedBroker
from ...errors import UnknownTransactionError
from ...message import Resolution, StoredMessage, TransactionState
from ...store.scrub import damage_reasons
from ...topics import RETRY_PREFIX
from .markup import (
    Markup,
    age,
    body_preview,
    duration,
    esc,
    join,
    number,
    size,
    table,
    tag,
    timestamp,
)

#: Rows of pending and of parked transactions, and of dead letters, shown per page.
SHOWN_TRANSACTIONS = 100
SHOWN_DEAD_LETTERS = 100
#: Messages a search by key shows.
SHOWN_BY_KEY = 20
#: How much of a body a dead-letter row previews.
ROW_PREVIEW_CHARS = 80

#: The navigation: path and label.
NAVIGATION = (
    ("/", "Overview"),
    ("/trends", "Trends"),
    ("/groups", "Consumer groups"),
    ("/transactions", "Transactions"),
    ("/dead-letters", "Dead letters"),
    ("/search", "Search"),
    ("/reconcile", "Reconciliation"),
)

READ_ONLY_NOTE = Markup(
    "This console is <strong>read-only</strong>: the broker has no access key. To resend, recheck and "
    "resolve from here, start the broker with <code>--access-key</code> and <code>--secret-key</code> "
    "(or pass <code>access_key</code> and <code>secret_key</code> to <code>make_console_app</code>), "
    "then sign in with them."
)


@dataclass(frozen=True)
class View:
    """What a page needs to know of the request: where links go and who may act."""

    base: str
    #: The session's CSRF token when an operator is signed in, else None.
    csrf: str | None
    #: Whether the broker has keys, i.e. whether signing in is possible at all.
    actions_enabled: bool

    def url(self, path: str, **query: str) -> str:
        return self.base + path + (f"?{urlencode(query)}" if query else "")

    @property
    def signed_in(self) -> bool:
        return self.csrf is not None

    def action(self, path: str, label: str, style: str = "secondary", **fields: str) -> Markup:
        """A POST form with one button; the CSRF token and ``fields`` ride as hidden inputs."""
        assert self.csrf is not None, "actions are rendered for signed-in operators only"
        hidden = join(tag("input", type="hidden", name=k, value=v) for k, v in {"csrf": self.csrf, **fields}.items())
        return tag("form", hidden + tag("button", label, type="submit", class_=style),
                   method="post", action=self.url(path))


@dataclass(frozen=True)
class Page:
    title: str
    content: Markup
    status: HTTPStatus = HTTPStatus.OK
    #: The navigation entry to mark as current.
    section: str = ""


def action_hint(view: View) -> Markup:
    """What an operator who may not act yet can do about it (nothing when signed in)."""
    if view.signed_in:
        return Markup("")
    if not view.actions_enabled:
        return tag("p", "Actions are off in this read-only console.", class_="note")
    return tag("p", Markup(f'<a href="{esc(view.url("/sign-in"))}">Sign in</a> with the broker\'s keys to act here.'),
               class_="note")


def _message_link(view: View, message_id: str) -> Markup:
    return tag("a", message_id, href=view.url("/search", id=message_id), class_="mono")


def _ids(view: View, message_ids: Sequence[str]) -> Markup:
    return tag("ul", join(tag("li", _message_link(view, m)) for m in message_ids), class_="ids")


# -- overview -------------------------------------------------------------------------------
def overview(broker: EmbeddedBroker, view: View) -> Page:
    stats = broker.stats()
    extra = stats.extra
    cards = (
        ("Topics", number(len(stats.topics))),
        ("Pending transactions", number(stats.pending_half)),
        ("Parked transactions", number(stats.parked)),
        ("Checks outstanding", number(stats.outstanding_checks)),
        ("Committed", number(extra.get("committed", 0))),
        ("Rolled back", number(extra.get("rolled_back", 0))),
        ("Delayed messages", number(extra.get("delayed", 0))),
        ("Dead letters", number(sum(stats.dlq_depth.values()))),
        ("Commit log", size(extra.get("commit_log_bytes", 0))),
    )
    summary = tag("dl", join(tag("div", tag("dt", k) + tag("dd", v)) for k, v in cards), class_="cards")
    topics = table(
        "Topics and queue depths", ("Topic", "Queues", "Messages", "Messages per queue"),
        [(t.name, number(t.queues), number(sum(t.depth)),
          ", ".join(f"q{q}: {number(d)}" for q, d in enumerate(t.depth)))
         for t in stats.topics],
        Markup("No topics yet. Send a message (topics are created on first use) or run "
               "<code>halfmoon-broker topics create NAME</code>."),
        numeric=(1, 2),
    )
    unanswered = table(
        "Producer groups whose checks go unanswered", ("Producer group", "Unanswered for"),
        [(group, duration(seconds)) for group, seconds in sorted(stats.unanswered_check_groups.items())],
        "Every producer group with transactions under check answers its checks.",
        numeric=(1,),
    )
    advice = Markup("")
    if stats.unanswered_check_groups:
        advice = tag("p", "No checker of these groups took or answered a check for over two check intervals: "
                          "start their Celery checker workers or connected producers.", class_="note")
    content = (_losses(broker, view) + tag("h2", "At a glance") + summary + tag("h2", "Topics") + topics
               + tag("h2", "Check-backs") + unanswered + advice)
    return Page("Overview", content, section="/")


def _losses(broker: EmbeddedBroker, view: View) -> Markup:
    """The loss panel: the ledger's open losses (messages destroyed by damaged or missing
    commit log bytes, found by recovery, ``repair`` or the scrub) and a scrub that cannot
    read the log; nothing when there are none."""
    store = broker.store
    reasons = damage_reasons(store)
    if not reasons:
        return Markup("")
    losses = store.losses.open_losses()
    rows = [(str(loss.loss_id), loss.found_by, timestamp(loss.found_at_ms), f"{loss.start}-{loss.end}",
             number(loss.records), _ids(view, loss.message_ids) if loss.message_ids else "none known",
             loss.detail) for loss in losses]
    notice = tag("div", tag("p", tag("strong", "Messages lost: ") + "; ".join(reasons) + ".")
                 + tag("p", "Every readable message is still delivered; these are not. Find what they were "
                            "from the ids and queue positions below (the producers' transaction_log, the "
                            "reconciliation), then acknowledge the losses."),
                 class_="notice error", role="alert")
    return notice + table(
        "Losses not acknowledged", ("Loss", "Found by", "Found at", "Commit log range", "Messages",
                                    "Message ids", "Detail"),
        rows, "No loss is open.", numeric=(4,),
    )


# -- consumer groups ------------------------------------------------------------------------
def groups(broker: EmbeddedBroker, view: View) -> Page:
    queues = broker.consumer_queues()
    totals: dict[tuple[str, str], list[int]] = {}
    for q in queues:
        total = totals.setdefault((q.group, q.topic), [0, 0])
        total[0] += q.lag
        total[1] += q.in_flight
    rows: list[list[object]] = []
    for (group, topic), (lag, in_flight) in totals.items():
        row: list[object] = [group, topic, number(lag), number(in_flight)]
        if view.signed_in:  # a skip per group and topic; one delete per group, on its first row
            first = not rows or rows[-1][0] != group
            skip = view.action("/groups/skip", "Skip backlog", "danger", group=group, topic=topic) if lag else ""
            row.append(join([skip, view.action("/groups/delete", "Delete group", "danger", group=group)])
                       if first else skip)
        rows.append(row)
    summary = table(
        "Lag per group and topic", ("Group", "Topic", "Lag", "In flight", *(("Action",) if view.signed_in else ())),
        rows,
        "No consumer group has received yet. A group appears here after its first receive "
        "(it starts at the beginning of the topic).",
        numeric=(2, 3),
    )
    detail = table(
        "Lag per queue", ("Group", "Topic", "Queue", "Lag", "In flight"),
        [(q.group, q.topic,
          "retry queue" if q.stored_topic.startswith(RETRY_PREFIX) else f"queue {q.queue_id}",
          number(q.lag), number(q.in_flight)) for q in queues],
        "No queues to show yet.",
        numeric=(3, 4),
    )
    note = tag("p", "Lag: messages the group has not acknowledged yet. In flight: received and invisible "
                    "to the group until acknowledged or their invisible duration ends. Skip backlog moves the "
                    "group past every message of the topic stored so far (they are not delivered to it; "
                    "halfmoon-broker groups reset also moves it back to a time). Delete group retires a "
                    "group no longer used: its lag and dead letters are no longer shown or counted. Both are "
                    "refused while the group consumes; should its consumers come back after a deletion, they "
                    "resume where it stopped.",
               class_="note")
    return Page("Consumer groups", note + action_hint(view) + summary + tag("h2", "Per queue") + detail,
                section="/groups")


# -- transactions ---------------------------------------------------------------------------
def transactions(broker: EmbeddedBroker, view: View) -> Page:
    pending, pending_total = broker.oldest_transactions(TransactionState.PENDING, SHOWN_TRANSACTIONS)
    parked, parked_total = broker.oldest_transactions(TransactionState.PARKED, SHOWN_TRANSACTIONS)
    pending_table = table(
        "Pending transactions, oldest first", ("Transaction", "Producer group", "Age", "Checks sent", "Messages"),
        [(tx.transaction_id, tx.producer_group, age(tx.born_timestamp_ms), number(tx.check_times),
          _ids(view, tx.message_ids)) for tx in pending],
        "No transaction is pending: every half message has been committed or rolled back.",
        numeric=(3,),
    )
    headers = ["Transaction", "Producer group", "Age", "Checks sent", "Messages"]
    if view.signed_in:
        headers.append("Actions")
    parked_table = table(
        "Parked transactions, oldest first", headers,
        [_parked_row(view, tx) for tx in parked],
        "No transaction is parked. A transaction is parked when its checks went unanswered "
        "check_max times; it waits here for an operator.",
        numeric=(3,),
    )
    content = (tag("h2", "Pending") + pending_table + _rest(pending_total - len(pending), "pending")
               + tag("h2", "Parked") + tag("p", "Recheck puts a transaction back under check with a fresh count. "
                                                "Resolve asks its producer group's checker once: the fenced "
                                                "transaction_log decides, and nothing changes if no checker "
                                                "answers.", class_="note")
               + action_hint(view) + parked_table + _rest(parked_total - len(parked), "parked"))
    return Page("Transactions", content, section="/transactions")


def _rest(count: int, what: str) -> Markup:
    if count <= 0:
        return Markup("")
    return tag("p", f"… and {number(count)} more {what} transactions, not shown.", class_="note")


def _parked_row(view: View, tx: OpenTransaction) -> list[object]:
    ids: Markup = _ids(view, tx.message_ids)
    if tx.problem:
        ids = ids + tag("p", f"Cannot be committed: {tx.problem}", class_="note")
    row: list[object] = [tx.transaction_id, tx.producer_group, age(tx.born_timestamp_ms), number(tx.check_times), ids]
    if view.signed_in:
        tid = tx.transaction_id
        row.append(tag("div", join((
            view.action("/transactions/recheck", "Recheck", id=tid),
            view.action("/transactions/resolve", "Resolve (ask checker)", id=tid),
            tag("a", "Force commit…", href=view.url("/transactions/force", id=tid, resolution="commit")),
            tag("a", "Force rollback…", href=view.url("/transactions/force", id=tid, resolution="rollback")),
        )), class_="actions"))
    return row


def force(view: View, tx: OpenTransaction, resolution: Resolution) -> Page:
    """The confirmation of a forced resolution: the warning, and a box to tick."""
    assert view.csrf is not None
    word = resolution.value.upper().replace("_", " ")
    warning = tag("div", tag("p", tag("strong", "Warning: ") + FORCE_WARNINGS[resolution].format(id=tx.transaction_id))
                  + tag("p", "Prefer Resolve, which asks the producer group's checker and lets the "
                             "transaction_log decide. Force only when you know the outcome of the database "
                             "transaction."), class_="notice warning", role="alert")
    details = tag("dl", join((
        tag("dt", "Transaction") + tag("dd", tx.transaction_id, class_="mono"),
        tag("dt", "Producer group") + tag("dd", tx.producer_group),
        tag("dt", "Age") + tag("dd", age(tx.born_timestamp_ms)),
        tag("dt", "Messages") + tag("dd", _ids(view, tx.message_ids)),
    )), class_="fields")
    hidden = join(tag("input", type="hidden", name=k, value=v)
                  for k, v in (("csrf", view.csrf), ("id", tx.transaction_id), ("resolution", resolution.value)))
    form = tag("form", hidden + tag("div", tag("input", type="checkbox", id="confirm", name="confirm", value="yes",
                                                required=True)
                                    + tag("label", f"I understand: record {word} without a check-back.",
                                          for_="confirm"), class_="check")
               + tag("div", tag("button", f"Force {word}", type="submit", class_="danger") + " "
                     + tag("a", "Cancel", href=view.url("/transactions")), class_="actions"),
               method="post", action=view.url("/transactions/force"))
    return Page(f"Force {word} of a parked transaction", warning + details + form, section="/transactions")


# -- dead letters ---------------------------------------------------------------------------
def dead_letters(broker: EmbeddedBroker, view: View, group: str | None) -> Page:
    depths = broker.stats().dlq_depth
    rows = [(tag("a", g, href=view.url("/dead-letters", group=g)), number(n)) for g, n in sorted(depths.items())]
    overview_table = table("Dead-letter queues", ("Consumer group", "Dead letters stored"), rows,
                           "No dead letters: no message has gone unacknowledged max_delivery_attempts times.",
                           numeric=(1,))
    content = overview_table
    if group is not None:
        messages = broker.list_dlq(group, SHOWN_DEAD_LETTERS)
        headers = ["Message", "Topic", "Keys", "Dead-lettered", "Body"]
        if view.signed_in:
            headers.append("Action")
        letters = table(
            f"Dead letters of group {group}, oldest first", headers,
            [_dead_letter_row(view, group, m) for m in messages],
            f"Group {group} has no dead letters.",
        )
        resend_note = tag("p", "Resend sends the message to this group again (its retry queue); other groups "
                               "are not affected.", class_="note")
        content += tag("h2", f"Group {group}") + resend_note + action_hint(view) + letters
    return Page("Dead letters", content, section="/dead-letters")


def _dead_letter_row(view: View, group: str, m: StoredMessage) -> list[object]:
    text = m.message.body[:ROW_PREVIEW_CHARS * 4].decode("utf-8", "replace")[:ROW_PREVIEW_CHARS]
    row: list[object] = [_message_link(view, m.message.message_id), m.message.topic, " ".join(m.message.keys),
                         timestamp(m.store_timestamp_ms), tag("span", text, class_="mono")]
    if view.signed_in:
        row.append(view.action("/dead-letters/resend", "Resend", group=group, id=m.message.message_id))
    return row


# -- search ---------------------------------------------------------------------------------
def search_forms(view: View, message_id: str = "", topic: str = "", key: str = "") -> Markup:
    by_id = tag("form", tag("fieldset", tag("legend", "By message id") + tag("div", tag(
        "label", "Message id", for_="search-id") + tag(
        "input", id="search-id", name="id", value=message_id, maxlength="64", required=True), class_="field")
        + tag("button", "Search by id", type="submit")), method="get", action=view.url("/search"))
    by_key = tag("form", tag("fieldset", tag("legend", "By topic and key") + tag("div", tag(
        "label", "Topic", for_="search-topic") + tag(
        "input", id="search-topic", name="topic", value=topic, maxlength="127", required=True), class_="field")
        + tag("div", tag("label", "Key", for_="search-key") + tag(
            "input", id="search-key", name="key", value=key, maxlength="128", required=True), class_="field")
        + tag("button", "Search by key", type="submit")), method="get", action=view.url("/search"))
    return tag("div", by_id + by_key, class_="searches")


def message_details(broker: EmbeddedBroker, view: View, found: StoredMessage, half: bool = False) -> Markup:
    """A message's fields, properties, body preview and transaction state."""
    m = found.message
    fields: list[tuple[str, object]] = [
        ("Message id", tag("span", m.message_id, class_="mono")),
        ("Topic", m.topic),
        ("Queue, offset", "not visible yet (a half message)" if half
         else f"queue {found.queue_id}, offset {number(found.queue_offset)}"),
        ("Keys", " ".join(m.keys) or "none"),
        ("Tag", m.tag or "none"),
        ("Born", timestamp(found.born_timestamp_ms)),
        ("Stored", timestamp(found.store_timestamp_ms)),
    ]
    if m.message_group:
        fields.append(("Message group (FIFO)", m.message_group))
    if m.delay_level or m.deliver_at_ms is not None:
        fields.append(("Delay", f"level {m.delay_level}" if m.delay_level else timestamp(m.deliver_at_ms or 0)))
    if found.transaction_id:
        fields.append(("Transaction", tag("span", found.transaction_id, class_="mono")))
        fields.append(("Transaction state", _transaction_state(broker, found.transaction_id)))
    dl = tag("dl", join(tag("dt", k) + tag("dd", v) for k, v in fields), class_="fields")
    props = table(f"Properties of {m.message_id}", ("Name", "Value"), sorted(m.properties.items()),
                  "No application properties.")
    return tag("article", tag("h2", f"Message {m.message_id}") + dl + props + tag("h3", "Body")
               + body_preview(bytes(m.body)), aria_label=f"Message {m.message_id}")


def _transaction_state(broker: EmbeddedBroker, transaction_id: str) -> str:
    try:
        return broker.transaction_state(transaction_id).value.replace("_", " ")
    except UnknownTransactionError:
        return "unknown: the broker no longer holds its records (past retention)"


# -- signing in -----------------------------------------------------------------------------
def sign_in(view: View, csrf: str, problem: str = "") -> Page:
    error = tag("p", problem, class_="notice error", role="alert") if problem else Markup("")
    form = tag("form", join((
        tag("input", type="hidden", name="csrf", value=csrf),
        tag("div", tag("label", "Access key", for_="access-key")
            + tag("input", id="access-key", name="access_key", autocomplete="username", required=True,
                  maxlength="256"), class_="field"),
        tag("div", tag("label", "Secret key", for_="secret-key")
            + tag("input", id="secret-key", name="secret_key", type="password", autocomplete="current-password",
                  required=True, maxlength="256"), class_="field"),
        tag("button", "Sign in", type="submit"),
    )), method="post", action=view.url("/sign-in"))
    intro = tag("p", "Sign in with the broker's access key and secret key (the ones its TCP clients use) "
                     "to resend dead letters and recheck or resolve parked transactions.")
    return Page("Sign in", error + intro + form,
                status=HTTPStatus.UNAUTHORIZED if problem else HTTPStatus.OK)


def problem(status: HTTPStatus, message: str, view: View) -> Page:
    """A refused request: what went wrong and where to go from here."""
    back = tag("p", Markup(f'<a href="{esc(view.url("/"))}">Back to the overview</a>'))
    return Page(f"{status.value} {status.phrase}", tag("p", message, role="alert") + back, status=status)
