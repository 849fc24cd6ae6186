"""The wheel, installed with each extra into a fresh venv outside the checkout, does what
that extra is for.

The wheel is built once from a clean copy of the checkout; every venv installs it by a
direct reference (``halfmoon[extra] @ file://...``, so no other ``halfmoon`` can be
picked) with its dependencies from the package index through pip's cache, and runs
with the temporary folder as working directory and no PYTHONPATH, so nothing is
imported from the checkout. The spark and all extras (pyspark alone is hundreds of MB)
are only resolved (``pip install --dry-run``), not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
import venv
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, inspect

from tests.outbox.alembic_user_project import APP_REVISION_ID, write_user_project
from tests.ports import free_port
from tests.wheelhouse import NOT_SOURCES, ROOT, built_wheel

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def wheel() -> Path:
    return built_wheel()


@dataclass
class Venv:
    """A fresh venv and a working folder outside the checkout."""

    path: Path
    work: Path

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE"}
               and not k.startswith("OUTBOX_")}
        return {**env, "PATH": f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}", **extra}

    def run(self, *argv: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*argv], cwd=self.work, env=self.env(**env), capture_output=True,
                                text=True, timeout=timeout)
        assert result.returncode == 0, f"{argv}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
        return result

    def python(self, code: str, **env: str) -> str:
        return self.run(self.bin("python"), "-c", code, **env).stdout

    def importable(self, module: str) -> bool:
        probe = subprocess.run([self.bin("python"), "-c", f"import {module}"], cwd=self.work,
                               env=self.env(), capture_output=True, timeout=120)
        return probe.returncode == 0

    def start(self, name: str, *argv: str, **env: str) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("wb") as log:
            return subprocess.Popen([*argv], cwd=self.work, env=self.env(**env), stdout=log,
                                    stderr=subprocess.STDOUT)

    def wait_for_log(self, name: str, process: subprocess.Popen[bytes], text: str) -> None:
        """Until ``text`` is in the process's log (a bound of 120 s, not a measurement)."""
        log = self.work / f"{name}.log"
        deadline = time.monotonic() + 120
        while text not in log.read_text(errors="replace"):
            assert process.poll() is None, f"{name} exited {process.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{name} never logged {text!r}: {log.read_text()[-3000:]}"
            time.sleep(0.2)


def _pip_install(python: str, requirement: str, *options: str, cwd: Path) -> None:
    """This interpreter's pip, installing into the environment of ``python`` (without
    PYTHONPATH, whose checkout may hold a ``halfmoon.egg-info`` that pip takes as installed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                             "--disable-pip-version-check", *options, requirement],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Venv]:
    """``install("celery,redis")``: a venv with ``halfmoon[celery,redis]`` from the wheel
    (one per set of extras in this module)."""
    made: dict[str, Venv] = {}

    def make(extras: str) -> Venv:
        if extras not in made:
            folder = tmp_path_factory.mktemp(f"venv-{extras.replace(',', '-') or 'core'}")
            venv.create(folder / "venv", with_pip=False)  # pip --python installs into it
            work = folder / "work"
            work.mkdir()
            requirement = f"halfmoon[{extras}] @ {wheel.as_uri()}" if extras else f"halfmoon @ {wheel.as_uri()}"
            _pip_install(str(folder / "venv" / "bin" / "python"), requirement, cwd=work)
            made[extras] = Venv(folder / "venv", work)
        return made[extras]

    return make


def test_core_runs_the_broker_server_and_its_cli(install: Callable[[str], Venv]) -> None:
    env = install("")
    location = env.python("import broker_embedded; print(broker_embedded.__file__)")
    assert location.startswith(str(env.path)), location  # the wheel's, not the checkout's
    assert not env.importable("sqlalchemy") and not env.importable("example_shop")
    assert env.python("import importlib.resources as r; print(r.files('broker_embedded')"
                      ".joinpath('py.typed').is_file())").strip() == "True"
    _broker_round_trip(env)
    needs = subprocess.run([env.bin("halfmoon-broker"), "serve", "--data-dir", str(env.work / "b2"), "--port", "0",
                            "--http-port", "0"], cwd=env.work, env=env.env(), capture_output=True, text=True,
                           timeout=120)
    assert needs.returncode == 2 and "--http-port needs prometheus_client" in needs.stderr
    needs = subprocess.run([env.bin("halfmoon-broker"), "serve", "--data-dir", str(env.work / "b3"), "--port", "0",
                            "--grpc-port", "0"], cwd=env.work, env=env.env(), capture_output=True, text=True,
                           timeout=120)
    assert needs.returncode == 2 and "--grpc-port needs grpcio and protobuf" in needs.stderr


def test_core_imports_outbox_without_an_orm(install: Callable[[str], Venv]) -> None:
    env = install("")
    env.python("import outbox, outbox.schema, outbox.settings, outbox.errors")
    assert "migrate" in env.run(env.bin("outbox"), "--help").stdout
    needs = subprocess.run([env.bin("outbox"), "migrate", "--database-url", "sqlite:///x.db"], cwd=env.work,
                           env=env.env(), capture_output=True, text=True, timeout=120)
    assert needs.returncode == 2 and needs.stderr.strip().splitlines() == [
        "outbox migrate: needs SQLAlchemy and Alembic: pip install 'halfmoon[sqlalchemy]'"]


def test_server_extra_serves_on_uvloop_with_metrics(install: Callable[[str], Venv]) -> None:
    env = install("server")
    assert env.importable("uvloop") and env.importable("prometheus_client") and env.importable("waitress")
    http_port = free_port()
    _broker_round_trip(env, "--http-port", str(http_port))
    # the round trip's message, as the HTTP port counted it (scraped before the server stopped)
    assert 'halfmoon_broker_messages_in_total{topic="order.paid"} 1.0' in (env.work / "metrics.txt").read_text()


def _our_alembic_head() -> str:
    """The newest revision of the checkout's outbox migrations (the wheel ships the same)."""
    from alembic.script import ScriptDirectory

    import outbox.integrations.alembic

    (head,) = ScriptDirectory(str(Path(outbox.integrations.alembic.__file__).parent)).get_heads()
    return head


GRPC_ROUTE = """
import sys
import grpc
from broker_embedded.server.grpc._proto import definition_pb2 as pb, service_pb2 as spb
with grpc.insecure_channel(sys.argv[1]) as channel:
    query = channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute",
                                request_serializer=spb.QueryRouteRequest.SerializeToString,
                                response_deserializer=spb.QueryRouteResponse.FromString)
    route = query(spb.QueryRouteRequest(topic=pb.Resource(name="order.paid")), timeout=30)
print(route.status.code == pb.OK, len(route.message_queues))
"""


def test_grpc_extra_serves_rocketmq5s_protocol(install: Callable[[str], Venv]) -> None:
    """The committed generated code runs on the protobuf the extra installs."""
    env = install("grpc")
    with _grpc_broker(env) as endpoint:
        assert env.run(env.bin("python"), "-c", GRPC_ROUTE, endpoint).stdout.split() == ["True", "4"]


@contextmanager
def _grpc_broker(env: Venv) -> Iterator[str]:
    """``halfmoon-broker serve --grpc-port`` of ``env``, until the block ends; its gRPC endpoint."""
    grpc_port = free_port()
    server = env.start("grpc-broker", env.bin("halfmoon-broker"), "serve", "--data-dir", str(env.work / "broker"),
                       "--port", str(free_port()), "--grpc-port", str(grpc_port))
    try:
        env.wait_for_log("grpc-broker", server, f"gRPC (RocketMQ 5) port on 127.0.0.1:{grpc_port}")
        yield f"127.0.0.1:{grpc_port}"
    finally:
        _stop(server)


RMQ5_ROUND_TRIP = """
import sys, time
from broker_embedded import Message, Resolution, connect
from outbox import Producer

broker = connect(f"rocketmq5://{sys.argv[1]}")
producer = Producer(broker, "shop")
producer.send_half(Message("orders", b"paid"), "tx-wheel")
producer.end_transaction("tx-wheel", Resolution.COMMIT)
deadline = time.monotonic() + 60
received = []
while not received and time.monotonic() < deadline:
    received = broker.receive("points", "orders", wait_s=1)
print(received[0].message.body.decode(), received[0].transaction_id)
broker.ack("points", received[0].receipt_handle)
broker.close()
"""


def test_rocketmq5_extra_runs_the_outbox_through_the_official_client(install: Callable[[str], Venv]) -> None:
    """``rocketmq5://`` from the wheel: a transactional message committed and consumed
    through the official client, against the wheel's own gRPC port."""
    env = install("grpc,rocketmq5")
    with _grpc_broker(env) as endpoint:
        out = env.run(env.bin("python"), "-c", RMQ5_ROUND_TRIP, endpoint).stdout
    assert out.split() == ["paid", "tx-wheel"]


def _broker_round_trip(env: Venv, *serve_options: str) -> None:
    """``halfmoon-broker serve``, then ``send`` and ``receive`` one message through it; with
    ``--http-port P`` among ``serve_options``, its /metrics saved in ``metrics.txt``."""
    assert "serve" in env.run(env.bin("halfmoon-broker"), "--help").stdout
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    server = env.start("broker", env.bin("halfmoon-broker"), "serve", "--data-dir", str(env.work / "broker"),
                       "--port", str(port), *serve_options)
    try:
        env.wait_for_log("broker", server, f"listening on 127.0.0.1:{port}")
        env.run(env.bin("halfmoon-broker"), "send", "order.paid", "from-the-wheel", "--url", url)
        received = env.run(env.bin("halfmoon-broker"), "receive", "points", "order.paid", "--max", "1",
                           "--wait", "10", "--url", url)
        assert "from-the-wheel" in received.stdout
        if "--http-port" in serve_options:
            http_port = serve_options[serve_options.index("--http-port") + 1]
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
                (env.work / "metrics.txt").write_bytes(response.read())
    finally:
        _stop(server)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sqlalchemy_extra_migrates_and_joins_an_apps_alembic_history(install: Callable[[str], Venv]) -> None:
    env = install("sqlalchemy")
    env.python("import outbox, outbox.integrations.sqlalchemy.session, outbox.integrations.alembic")
    assert "migrate" in env.run(env.bin("outbox"), "--help").stdout
    url = f"sqlite:///{env.work / 'outbox.sqlite3'}"
    env.run(env.bin("outbox"), "migrate", "--database-url", url)  # issue 11 item 4, from a wheel
    engine = create_engine(url)
    try:  # issue 11 item 2: Django's shape
        table = inspect(engine)
        assert table.get_pk_constraint("outbox_consumed_message")["constrained_columns"] == ["id"]
        assert [u["name"] for u in table.get_unique_constraints("outbox_consumed_message")] == [
            "uniq_outbox_consumed_message"]
    finally:
        engine.dispose()

    app_url = f"sqlite:///{env.work / 'app.sqlite3'}"  # the docs' recipe, with the venv's alembic
    ini = write_user_project(env.work / "project", app_url)
    env.run(env.bin("alembic"), "-c", str(ini), "upgrade", "heads")
    with sqlite3.connect(env.work / "app.sqlite3") as conn:
        versions = {row[0] for row in conn.execute("SELECT version_num FROM alembic_version")}
    assert versions == {_our_alembic_head(), APP_REVISION_ID}
    env.run(env.bin("alembic"), "-c", str(ini), "check")


@pytest.mark.postgres
def test_postgres_extra_migrates_postgresql(install: Callable[[str], Venv], postgres_url: str) -> None:
    env = install("sqlalchemy,postgres")
    env.run(env.bin("outbox"), "migrate", "--database-url", postgres_url)
    engine = create_engine(postgres_url)
    try:
        assert {"outbox_transaction_log", "outbox_consumed_message", "outbox_alembic_version"} <= set(
            inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.redis
def test_celery_redis_extra_worker_answers_over_redis(install: Callable[[str], Venv], redis_url: str) -> None:
    env = install("celery,redis")  # issue 11 item 3
    app = "outbox.integrations.celery.worker"
    settings = {"OUTBOX_CELERY_BROKER_URL": redis_url,
                "OUTBOX_DATABASE_URL": f"sqlite:///{env.work / 'outbox.sqlite3'}"}
    worker = env.start("worker", env.bin("celery"), "-A", app, "worker", "-Q", "outbox.check.shop",
                       "--pool", "threads", "-n", "hm-wheel@localhost", "--loglevel", "INFO", **settings)
    try:
        env.wait_for_log("worker", worker, "hm-wheel@localhost ready")
        pong = env.run(env.bin("celery"), "-A", app, "inspect", "ping", "-d", "hm-wheel@localhost",
                       "--timeout", "10", **settings)
        assert "pong" in pong.stdout
    finally:
        _stop(worker)


DJANGO_SETTINGS = """\
import os
from pathlib import Path

BASE = Path(__file__).resolve().parent
SECRET_KEY = "wheel-test"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                  "django.contrib.sessions", "django.contrib.messages", "outbox.integrations.django"]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware",
              "django.contrib.messages.middleware.MessageMiddleware"]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
              "OPTIONS": {"context_processors": ["django.template.context_processors.request",
                                                 "django.contrib.auth.context_processors.auth",
                                                 "django.contrib.messages.context_processors.messages"]}}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE / "db.sqlite3",
                         "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20}}}
OUTBOX = {"BROKER_URL": os.environ.get("SITE_BROKER_URL", f"embedded://{BASE / 'broker'}"),
          "PRODUCER_GROUP": "shop"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""


def test_django_extra_without_sqlalchemy(install: Callable[[str], Venv]) -> None:
    env = install("django")
    assert not env.importable("sqlalchemy")
    django = _django_migrates(env)
    _another_services_transaction_is_left_alone(env, django)


def _django_migrates(env: Venv) -> dict[str, str]:
    """A Django site with the outbox app in ``env``, checked and migrated to head; the
    variables that select its settings."""
    (env.work / "site_settings.py").write_text(DJANGO_SETTINGS)
    django = {"DJANGO_SETTINGS_MODULE": "site_settings", "PYTHONPATH": str(env.work)}
    env.run(env.bin("python"), "-m", "django", "check", **django)
    env.run(env.bin("python"), "-m", "django", "migrate", "-v0", **django)
    with sqlite3.connect(env.work / "db.sqlite3") as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(outbox_consumed_message)")}
        applied = {row[0] for row in conn.execute(
            "SELECT name FROM django_migrations WHERE app = 'halfmoon_outbox'")}
    assert columns == {"id", "consumer_group", "message_id", "topic", "transaction_id", "consumed_at"}
    ours = Path(env.python("import outbox.integrations.django.migrations as m; print(m.__file__)").strip()).parent
    assert applied == {path.stem for path in ours.glob("0*.py")}  # every one of ours: head
    return django


def test_an_editable_install_maps_migrations_to_their_import_names(tmp_path: Path) -> None:
    """``pip install -e`` (what ``./dev`` runs) of a fresh copy of the checkout: the package
    imports ``migrations/alembic`` and ``migrations/django`` under their installed names, and
    ``outbox migrate`` and Django's ``migrate`` reach head. The dependencies are this
    interpreter's (``.pth`` lines), so nothing is downloaded."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    env = Venv(tmp_path / "venv", tmp_path / "work")
    env.work.mkdir()
    venv.create(env.path, with_pip=False)
    (site_packages,) = (env.path / "lib").glob("python3*/site-packages")
    dependencies = [path for path in sys.path if Path(path).name == "site-packages"]
    (site_packages / "zz_dependencies.pth").write_text("".join(f"{path}\n" for path in dependencies))
    _pip_install(env.bin("python"), str(source), "--no-deps", "--no-build-isolation", "--editable",
                 cwd=env.work)
    found = env.python("import outbox.integrations.alembic as a, outbox.integrations.django.migrations as m\n"
                       "print(a.__file__); print(m.__file__)").split()
    assert found == [str(source / "migrations" / "alembic" / "__init__.py"),
                     str(source / "migrations" / "django" / "__init__.py")]
    env.run(env.bin("outbox"), "migrate", "--database-url", f"sqlite:///{env.work / 'outbox.sqlite3'}")
    with sqlite3.connect(env.work / "outbox.sqlite3") as conn:
        assert conn.execute("SELECT version_num FROM outbox_alembic_version").fetchall() == [
            (_our_alembic_head(),)]
    _django_migrates(env)


def _another_services_transaction_is_left_alone(env: Venv, django: dict[str, str]) -> None:
    """Issue 11 item 1 from the wheel: a transaction of producer group ``billing`` (another
    service's database) is not fenced in this project's database by ``outbox_check``."""
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    server = env.start("broker-tcp", env.bin("halfmoon-broker"), "serve", "--data-dir",
                       str(env.work / "broker-tcp"), "--port", str(port))
    try:
        env.wait_for_log("broker-tcp", server, f"listening on 127.0.0.1:{port}")
        env.python("from broker_embedded import BrokerClient, Message\n"
                   f"with BrokerClient({url!r}) as c:\n"
                   "    c.send_half(Message('invoice.paid', b'{}'), producer_group='billing', transaction_id='tx-billing')")
        for group in ([], ["--group", "billing"]):
            refused = subprocess.run([env.bin("django-admin"), "outbox_check", "tx-billing", *group],
                                     cwd=env.work, env=env.env(SITE_BROKER_URL=url, **django),
                                     capture_output=True, text=True, timeout=120)
            assert refused.returncode == 1 and "billing" in refused.stderr, refused.stderr
        state = env.run(env.bin("halfmoon-broker"), "tx", "state", "tx-billing", "--url", url)
        assert "pending" in state.stdout.lower()
        with sqlite3.connect(env.work / "db.sqlite3") as conn:
            assert conn.execute("SELECT count(*) FROM outbox_transaction_log").fetchone() == (0,)
    finally:
        _stop(server)


OBSERVED = """
from pathlib import Path
from prometheus_client import CollectorRegistry, generate_latest
from broker_embedded import EmbeddedBroker, Message, Resolution
from outbox import Producer, metrics, tracing

registry = CollectorRegistry()
metrics.install(registry=registry)
tracing.install()  # the API alone, no SDK: spans that record nothing
with EmbeddedBroker(Path("broker")) as broker:
    producer = Producer(broker, "shop")
    producer.send_half(Message("order.paid", b"{}"), "tx-1")
    producer.end_transaction("tx-1", Resolution.COMMIT)
print(generate_latest(registry).decode())
"""


def test_metrics_and_tracing_extras(install: Callable[[str], Venv]) -> None:
    core = install("")
    for module, extra in (("outbox.metrics", "metrics"), ("outbox.tracing", "tracing")):
        probe = subprocess.run([core.bin("python"), "-c", f"import {module}"], cwd=core.work, env=core.env(),
                               capture_output=True, text=True, timeout=120)
        assert f"{module} needs" in probe.stderr and f"pip install 'halfmoon[{extra}]'" in probe.stderr
    exposition = install("metrics,tracing").python(OBSERVED)
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(exposition) for sample in family.samples}
    assert samples[("halfmoon_outbox_transactions_total", (("outcome", "committed"), ("producer_group", "shop")))] == 1
    assert samples[("halfmoon_outbox_half_send_duration_seconds_count", (("producer_group", "shop"),))] == 1


@pytest.mark.parametrize("extras", ["spark", "all"])
def test_big_extras_resolve(wheel: Path, tmp_path: Path, extras: str) -> None:
    """Resolution only: every requirement of the extra has a release that fits the others."""
    report = tmp_path / "report.json"
    _pip_install(sys.executable, f"halfmoon[{extras}] @ {wheel.as_uri()}", "--dry-run",
                 "--ignore-installed", "--report", str(report), cwd=tmp_path)
    resolved = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert {"pyspark", "pyarrow", "pandas", "sqlalchemy"} <= resolved



ASYNC_ORDER = """
import asyncio, sys
from sqlalchemy import Column, Integer, MetaData, Table
from sqlalchemy.ext.asyncio import async_sessionmaker
from outbox import AsyncProducer, transactional_message
from outbox.integrations.sqlalchemy.engine import create_async_engine
from outbox.integrations.sqlalchemy.tables import metadata

orders = Table("orders", MetaData(), Column("amount", Integer))

async def main() -> None:
    engine = create_async_engine("sqlite+aiosqlite:///shop.sqlite3")
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.run_sync(orders.metadata.create_all)
    async with AsyncProducer(sys.argv[1], "shop") as producer:
        @transactional_message(producer, async_sessionmaker(engine), topic="order.paid")
        async def pay(session, amount):
            await session.execute(orders.insert().values(amount=amount))
        await pay(40)
    await engine.dispose()

asyncio.run(main())
"""


def test_asyncio_extra_pays_from_async_code(install: Callable[[str], Venv]) -> None:
    env = install("sqlalchemy,asyncio")
    _pip_install(env.bin("python"), "aiosqlite", cwd=env.work)  # the application's own async driver
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    server = env.start("broker", env.bin("halfmoon-broker"), "serve", "--data-dir", str(env.work / "broker"),
                       "--port", str(port))
    try:
        env.wait_for_log("broker", server, f"listening on 127.0.0.1:{port}")
        (env.work / "pay.py").write_text(ASYNC_ORDER)
        env.run(env.bin("python"), "pay.py", url)
        received = env.run(env.bin("halfmoon-broker"), "receive", "points", "order.paid", "--max", "1",
                           "--wait", "10", "--url", url)
        assert json.loads(json.loads(received.stdout)[0]["message"]["body"]) == {"amount": 40}
    finally:
        _stop(server)
    with sqlite3.connect(env.work / "shop.sqlite3") as conn:
        assert conn.execute("SELECT count(*) FROM outbox_transaction_log").fetchone() == (1,)
