"""The shop demo: every piece as a real process, a few hundred orders, injected faults.

Processes: the broker (``python -m broker_embedded serve`` with the Celery checker and an
HTTP port for its metrics, scraped at the end into ``broker-metrics.txt``), a
``celery worker`` answering check-backs from the account database, the account service
(Django) and the member service (SQLAlchemy consumer). Orders go over HTTP while the
scenarios below strike; then the demo waits until every transaction is resolved and
every message consumed, and checks the books of both services against each other.
With ``--keep`` every service stays up after the checks, until Ctrl-C or SIGTERM, so the
broker's console (the address it prints) can be opened on what the run left.

Scenarios (``--scenario`` picks some; all by default):

* ``crash-after-commit``: the account process dies after the DB commit, before COMMIT
  reaches the broker; check-back through Celery delivers the message;
* ``crash-before-commit``: it dies after the half message, before the DB commit; the
  fence answers ROLLBACK and nothing is delivered;
* ``insufficient-balance``: orders beyond a balance fail and roll back (ROLLBACK sent);
* ``broker-restart``: the broker is SIGKILLed mid-run and restarted;
* ``broker-outage``: before the other orders, the broker is SIGKILLed and stays down while
  ``OUTAGE_ORDERS`` orders are placed (no crash faults meanwhile): the account service is in
  store mode (``OUTBOX["ON_BROKER_DOWN"] = "store"``), so they all succeed, their messages
  wait in the account database, and the relay process hands them to the broker once it is
  back; the demo then waits out the account service's back-off (``outbox.outage``), so the
  faults that follow reach the broker as in the other scenarios;
* ``consumer-crash``: the member service dies in the middle of a handler;
* ``duplicate-delivery``: already-delivered messages are delivered again.
"""

from __future__ import annotations

import logging
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# The demo operates the broker as well as using it: it exports the broker's data for the
# reconciliation, an admin call of broker_embedded's TCP client that no application makes.
from broker_embedded import BrokerClient
from outbox import BrokerError, Message
from outbox.stored import PROBE_EVERY_S

from .ledger import LedgerReport, read_ledger, unrelayed
from .processes import Supervisor, free_port, port_answers, python_module, wait_until

log = logging.getLogger("example_shop.demo")

SCENARIOS = (
    "crash-after-commit", "crash-before-commit", "insufficient-balance",
    "broker-restart", "broker-outage", "consumer-crash", "duplicate-delivery",
)
PRODUCER_GROUP = "account-service"
MEMBER_GROUP = "member-service"
#: Orders placed while the broker is down (``broker-outage``).
OUTAGE_ORDERS = 30
#: After the outage, how long the demo waits for the account service's store-mode producer
#: to end its outage (its probe asks every ``PROBE_EVERY_S``) before the orders whose faults
#: the books count on the broker seeing (a crash before the commit must reach it as a half).
OUTAGE_END_WAIT_S = PROBE_EVERY_S * 5


@dataclass
class DemoOptions:
    """What to run; ``database_url``/``redis_url`` switch from SQLite/filesystem to servers."""

    orders: int = 300
    customers: int = 10
    balance: int = 2000
    concurrency: int = 4
    work_dir: Path = Path("demo-work")
    database_url: str | None = None
    redis_url: str | None = None
    scenarios: frozenset[str] = frozenset(SCENARIOS)
    seed: int = 7
    settle_timeout_s: float = 240.0
    reconcile: bool = True
    keep: bool = False


@dataclass
class Tally:
    """What the HTTP side saw."""

    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1


def _say(text: str) -> None:
    print(text, flush=True)


class ShopDemo:
    """One run of the demo (see the module docstring)."""

    def __init__(self, options: DemoOptions) -> None:
        self.options = options
        self.work = options.work_dir.resolve()
        self.random = random.Random(options.seed)
        self.tally = Tally()
        self._account_restart = threading.Lock()
        self._stopping = threading.Event()
        self._broker_down = threading.Event()

    # -- set-up ---------------------------------------------------------------------------
    def _databases(self) -> tuple[str, str]:
        if not self.options.database_url:
            return (f"sqlite:///{self.work / 'account.sqlite3'}", f"sqlite:///{self.work / 'member.sqlite3'}")
        import psycopg
        from sqlalchemy.engine import make_url

        base = make_url(self.options.database_url)
        admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
        urls = []
        with psycopg.connect(admin, autocommit=True) as conn:
            for service in ("account", "member"):
                name = f"{base.database}_shop_{service}"
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{name}"')
                urls.append(base.set(drivername="postgresql+psycopg", database=name)
                            .render_as_string(hide_password=False))
        return urls[0], urls[1]

    def _start(self, supervisor: Supervisor, account_db: str, member_db: str) -> dict[str, str]:
        broker_port, http_port, account_port, member_port = free_port(), free_port(), free_port(), free_port()
        broker_url, broker_http = f"tcp://127.0.0.1:{broker_port}", f"http://127.0.0.1:{http_port}"
        env = {
            "SHOP_WORK_DIR": str(self.work),
            "SHOP_ACCOUNT_DATABASE_URL": account_db,
            "SHOP_MEMBER_DATABASE_URL": member_db,
            "SHOP_PRODUCER_GROUP": PRODUCER_GROUP,
            "OUTBOX_BROKER_URL": broker_url,
            "OUTBOX_DATABASE_URL": account_db,
            "OUTBOX_CELERY_BROKER_URL": self.options.redis_url or "filesystem://",
            "OUTBOX_CELERY_DATA_DIR": str(self.work / "celery"),
            "DJANGO_SETTINGS_MODULE": "example_shop.account.settings",
        }
        if "consumer-crash" in self.options.scenarios:
            env["SHOP_MEMBER_CRASH_AT"] = "7"
        supervisor.add("broker", python_module(
            "broker_embedded", "serve", "--data-dir", str(self.work / "broker"), "--port", str(broker_port),
            "--http-port", str(http_port), "--transaction-timeout", "2", "--check-interval", "2", "--export-root", str(self.work / "broker-export"),
            "--checker", "outbox.integrations.celery.checker:make_checker",
        ), env, ready=lambda: port_answers(broker_port)).start()
        _say(f"  broker        {broker_url} (data in {self.work / 'broker'})")
        _say(f"  broker HTTP   {broker_http}/metrics (Prometheus), {broker_http}/ (console)")
        supervisor.add("celery-worker", python_module(
            "celery", "-A", "outbox.integrations.celery.app", "worker", "-Q", f"outbox.check.{PRODUCER_GROUP}",
            "--pool", "threads", "-c", "4", "--loglevel", "INFO",
        ), env).start()
        _say(f"  celery worker queue outbox.check.{PRODUCER_GROUP} on {env['OUTBOX_CELERY_BROKER_URL']}")
        migrate = supervisor.add("account-migrate", python_module("example_shop.account", "migrate"), env)
        migrate.start()
        if migrate.wait_exit(120) != 0:
            raise RuntimeError(f"account migrations failed; see {migrate.log_path}")
        supervisor.add("account", python_module("example_shop.account", "serve", "--port", str(account_port)),
                       env, ready=lambda: port_answers(account_port)).start()
        _say(f"  account       http://127.0.0.1:{account_port}/ (Django, {account_db.split(':')[0]})")
        supervisor.add("relay", python_module("example_shop.account", "relay"), env).start()
        _say("  relay         hands the messages stored while the broker is down to it (manage.py outbox_relay)")
        supervisor.add("member", python_module("example_shop.member", "--port", str(member_port)),
                       env, ready=lambda: port_answers(member_port)).start()
        _say(f"  member        http://127.0.0.1:{member_port}/points (SQLAlchemy consumer)")
        return {"broker": broker_url, "broker_http": broker_http, "account": f"http://127.0.0.1:{account_port}",
                "member": f"http://127.0.0.1:{member_port}"}

    # -- orders ---------------------------------------------------------------------------
    def _fault_for(self, index: int) -> str | None:
        if self._broker_down.is_set():
            return None
        scenarios = self.options.scenarios
        if "crash-after-commit" in scenarios and index % 37 == 5:
            return "crash-after-commit"
        if "crash-before-commit" in scenarios and index % 43 == 11:
            return "crash-before-commit"
        return None

    def _ensure_account(self, supervisor: Supervisor) -> None:
        with self._account_restart:
            account = supervisor["account"]
            if not account.alive and not self._stopping.is_set():
                account.start()
                self.tally.faults["account restarts"] += 1

    def _place(self, supervisor: Supervisor, client: httpx.Client, index: int, customer: str, amount: int) -> None:
        order_id = f"o{index:05d}-{uuid.uuid4().hex[:6]}"
        fault = self._fault_for(index)
        headers = {"X-Shop-Fault": fault} if fault else {}
        refused = "gave up: broker unavailable"
        for _attempt in range(30):
            try:
                response = client.post("/orders", json={"order_id": order_id, "customer": customer,
                                                        "amount": amount}, headers=headers)
            except httpx.ConnectError:  # never reached the service: safe to send again
                refused = "gave up: account service unreachable"
                self._ensure_account(supervisor)
                time.sleep(0.2)  # another thread may be starting it
                continue
            except httpx.TransportError:  # reached it, outcome unknown: the books will tell
                if fault:
                    self.tally.faults[fault] += 1
                self.tally.count("account crashed mid-request")
                self._ensure_account(supervisor)
                return
            if response.status_code == 503:  # broker restarting: the order was not taken
                refused = "gave up: broker unavailable"
                time.sleep(0.5)
                continue
            paid = "paid while the broker was down" if self._broker_down.is_set() else "paid"
            self.tally.count({201: paid, 409: "rejected: insufficient balance"}.get(
                response.status_code, f"HTTP {response.status_code}"))
            return
        self.tally.count(refused)

    def _place_orders(self, supervisor: Supervisor, urls: dict[str, str], customers: list[str]) -> None:
        total = self.options.orders
        plan = [(i, self.random.choice(customers), self.random.randint(20, 400)) for i in range(total)]
        restart_at = total // 2 if "broker-restart" in self.options.scenarios else -1
        # No keep-alive: a connection pooled before an account crash would fail uncertainly.
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=urls["account"], timeout=60, limits=limits) as client, \
                ThreadPoolExecutor(self.options.concurrency) as pool:
            if "broker-outage" in self.options.scenarios:
                outage = [(total + i, self.random.choice(customers), self.random.randint(20, 400))
                          for i in range(OUTAGE_ORDERS)]
                _say(f"  fault: SIGKILL the broker; it stays down while {OUTAGE_ORDERS} orders are placed")
                supervisor["broker"].kill()
                self._broker_down.set()
                self.tally.faults["broker outages"] += 1
                list(pool.map(lambda order: self._place(supervisor, client, *order), outage))
                self._broker_down.clear()
                supervisor["broker"].start()
                _say(f"  the broker is back; the relay hands over what the orders stored meanwhile; waiting "
                     f"{OUTAGE_END_WAIT_S:.0f} s for the account service's probe to find it")
                time.sleep(OUTAGE_END_WAIT_S)
            for start in range(0, total, 50):
                chunk = plan[start:start + 50]
                list(pool.map(lambda order: self._place(supervisor, client, *order), chunk))
                self._ensure_account(supervisor)
                _say(f"  orders {start + len(chunk):4d}/{total}  {dict(self.tally.outcomes)}")
                if start <= restart_at < start + 50:
                    _say("  fault: SIGKILL the broker mid-run, then restart it")
                    supervisor["broker"].restart()
                    self.tally.faults["broker restarts"] += 1

    # -- settling -------------------------------------------------------------------------
    def _watch_member(self, supervisor: Supervisor) -> None:
        while not self._stopping.wait(0.5):
            member = supervisor["member"]
            if not member.alive:
                _say("  fault: the member service died mid-handler; restarting it")
                self.tally.faults["consumer restarts"] += 1
                member.start()

    def _settled(self, client: BrokerClient, account_db: str) -> bool:
        try:
            stats = client.stats()
        except BrokerError:
            return False
        lag = stats.consumer_lag.get(MEMBER_GROUP, {}).get("order.paid", 1)
        return stats.pending_half == 0 and lag == 0 and unrelayed(account_db) == 0

    def _duplicate_deliveries(self, client: BrokerClient, count: int = 3) -> int:
        delivered = [m for q in range(4) for m in client.read("order.paid", q, 0, 5)][:count]
        for stored in delivered:
            client.send(Message("order.paid", stored.message.body, keys=stored.message.keys,
                                message_id=stored.message.message_id))
        return len(delivered)

    # -- the run --------------------------------------------------------------------------
    def run(self) -> int:
        options = self.options
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / "logs").mkdir(parents=True)
        _say(f"halfmoon example shop: {options.orders} orders, scenarios: {', '.join(sorted(options.scenarios))}")
        account_db, member_db = self._databases()
        with Supervisor(self.work / "logs") as supervisor:
            try:
                urls = self._start(supervisor, account_db, member_db)
                customers = [f"customer{n:02d}" for n in range(options.customers)]
                with httpx.Client(base_url=urls["account"], timeout=30) as http:
                    for name in customers:
                        http.post("/api/customers", json={"name": name, "balance": options.balance}).raise_for_status()
                watcher = threading.Thread(target=self._watch_member, args=(supervisor,), daemon=True)
                watcher.start()
                self._place_orders(supervisor, urls, customers)
                with BrokerClient(urls["broker"], timeout_s=10) as client:
                    _say("  waiting for check-backs and consumers to settle ...")
                    wait_until(lambda: self._settled(client, account_db), options.settle_timeout_s,
                               "the shop to settle", 1.0)
                    if "duplicate-delivery" in options.scenarios:
                        injected = self._duplicate_deliveries(client)
                        self.tally.faults["duplicate deliveries"] += injected
                        _say(f"  fault: delivered {injected} already-consumed messages again")
                        wait_until(lambda: self._settled(client, account_db), options.settle_timeout_s,
                                   "duplicates", 1.0)
                    report = read_ledger(account_db, member_db, options.customers * options.balance)
                    export_dir = self.work / "broker-export"
                    client.export(str(export_dir))
                metrics = self._scrape_broker(urls["broker_http"])
            finally:
                self._stopping.set()
            if not options.keep:
                supervisor.stop_all()
            self._print(report, export_dir, metrics)
            reconciled = self._reconcile(account_db, member_db, export_dir) if options.reconcile else True
            if options.keep:
                _keep_until_signalled(urls)
        return 0 if report.ok and reconciled else 1

    def _scrape_broker(self, broker_http: str) -> Path:
        """The broker's /metrics as the shop left them, saved for the summary."""
        path = self.work / "broker-metrics.txt"
        path.write_text(httpx.get(f"{broker_http}/metrics", timeout=10).raise_for_status().text)
        return path

    def _reconcile(self, account_db: str, member_db: str, export_dir: Path) -> bool:
        """Run the Spark reconciliation over both databases and the broker export."""
        if shutil.which("java") is None:
            _say("  reconciliation skipped: Spark needs Java 17 (java is not on PATH)")
            return True
        out = self.work / "reconciliation"
        _say("  running the Spark reconciliation report ...")
        result = subprocess.run(
            [sys.executable, "-m", "outbox.reconcile", "--producer-db", account_db, "--consumer-db", member_db,
             "--broker-export", str(export_dir), "--out", str(out), "--grace-seconds", "0",
             "--master", "local[2]"],
            capture_output=True, text=True,
        )
        (self.work / "logs" / "reconcile.log").write_text(result.stdout + result.stderr)
        verdict = {0: "clean", 1: "ANOMALIES FOUND"}.get(result.returncode, "FAILED to run")
        _say(f"  reconciliation: {verdict}; report {out / 'report.html'}")
        return result.returncode == 0

    def _print(self, report: LedgerReport, export_dir: Path, metrics: Path) -> None:
        _say("")
        _say("  requests".ljust(36) + "count")
        for outcome, count in sorted(self.tally.outcomes.items()):
            _say(f"  {outcome:<34}{count}")
        for fault, count in sorted(self.tally.faults.items()):
            _say(f"  fault: {fault:<27}{count}")
        _say("")
        _say("  books".ljust(36) + "value")
        for name, value in report.rows():
            _say(f"  {name:<34}{value}")
        _say("")
        _say("  broker /metrics at the end".ljust(36) + "value")
        for name, value in broker_figures(metrics):
            _say(f"  {name:<34}{value:g}")
        _say("")
        _say(f"  broker metrics: {metrics}")
        _say(f"  broker export: {export_dir}")
        _say(f"  logs: {self.work / 'logs'}")
        _say("  RESULT: " + ("OK: nothing lost, nothing phantom, nothing twice" if report.ok else "FAILED"))


#: What the summary shows of the broker's metrics: its row name, the metric, its labels.
BROKER_FIGURES = (
    ("transactions committed", "halfmoon_broker_transactions_ended_total", {"outcome": "commit"}),
    ("transactions rolled back", "halfmoon_broker_transactions_ended_total", {"outcome": "rollback"}),
    ("transactions pending", "halfmoon_broker_transactions_pending", {}),
    ("transactions parked", "halfmoon_broker_transactions_parked", {}),
    ("check-backs answered COMMIT", "halfmoon_broker_check_outcomes_total", {"outcome": "commit"}),
    ("check-backs answered ROLLBACK", "halfmoon_broker_check_outcomes_total", {"outcome": "rollback"}),
    ("order.paid messages stored", "halfmoon_broker_topic_messages", {"topic": "order.paid"}),
    ("member-service lag", "halfmoon_broker_consumer_lag_messages", {"group": MEMBER_GROUP, "topic": "order.paid"}),
    ("member-service dead letters", "halfmoon_broker_dlq_messages", {"group": MEMBER_GROUP}),
)


def broker_figures(metrics: Path) -> list[tuple[str, float]]:
    """The ``BROKER_FIGURES`` rows of a saved /metrics scrape (0 for a sample it lacks:
    a counter not counted since the broker's last start, a group without dead letters)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.read_text()) for s in family.samples}
    return [(row, samples.get((name, tuple(sorted(labels.items()))), 0.0)) for row, name, labels in BROKER_FIGURES]


def _keep_until_signalled(urls: dict[str, str]) -> None:
    """Wait for Ctrl-C or SIGTERM (the services stay up meanwhile), then return."""
    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        _say("")
        _say(f"  kept running (--keep): console {urls['broker_http']}/  metrics {urls['broker_http']}/metrics")
        _say(f"  broker {urls['broker']}  account {urls['account']}/  member {urls['member']}/points")
        _say("  Ctrl-C or SIGTERM stops every service")
        while not stop.wait(1.0):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    _say("  stopping the services")


def run_demo(options: DemoOptions) -> int:
    """Run the demo; exit status 0 when the books agree."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return ShopDemo(options).run()
