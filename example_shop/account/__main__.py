"""``python -m example_shop.account migrate|serve --port N|relay``: the account service (``relay``:
its store-mode relay, ``manage.py outbox_relay``)."""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(prog="example_shop.account")
    parser.add_argument("command", choices=["migrate", "serve", "relay"])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_shop.account.settings")
    import django
    from django.core.management import call_command

    django.setup()
    if args.command == "migrate":
        call_command("migrate", verbosity=0)
        return 0
    if args.command == "relay":
        call_command("outbox_relay")
        return 0
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import run

    run("127.0.0.1", args.port, WSGIHandler(), ipv6=False, threading=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
