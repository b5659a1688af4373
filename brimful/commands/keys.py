"""``brimful keys``: create, list and revoke API keys (straight in Redis: the first admin
key has to come from somewhere).

    brimful keys create --tenant acme --scopes submit,read [--name ci]
    brimful keys list
    brimful keys revoke KEY_ID
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time

from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import get_settings

_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("keys", help="create, list or revoke API keys")
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key; it is printed once and stored only as a hash")
    create.add_argument("--tenant", required=True, help="whose tasks the key submits and reads")
    create.add_argument("--scopes", default="submit,read", help="comma-separated: submit, read, admin, operator")
    create.add_argument("--name", default="", help="a note on what the key is for")
    actions.add_parser("list", help="every key: id, tenant, scopes, state (never the key)")
    revoke = actions.add_parser("revoke", help="refuse a key from its next request on")
    revoke.add_argument("key_id", help="the whole id shown by `list` (12 characters)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    settings = get_settings()
    redis = make_redis(settings)
    keys = ApiKeys(redis, RedisKeys(settings.key_prefix))
    try:
        if args.action == "create":
            if not _TENANT.match(args.tenant):
                print("brimful keys: a tenant is 1-64 letters, digits, '_', '.' or '-'", file=sys.stderr)
                return 1
            try:
                scopes = [Scope(s.strip()) for s in args.scopes.split(",") if s.strip()]
            except ValueError:
                print(f"brimful keys: scopes are {', '.join(s.value for s in Scope)}", file=sys.stderr)
                return 1
            key, record = await keys.create(args.tenant, scopes, args.name)
            print(key)
            print(
                f"id {record.key_id}  tenant {record.tenant}  scopes {','.join(record.scopes)}"
                "  (the key is shown this once)",
                file=sys.stderr,
            )
        elif args.action == "list":
            print(f"{'id':<13} {'tenant':<20} {'scopes':<20} {'state':<8} {'created':<19} name")
            for record in await keys.list():
                created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created_at_ms / 1000))
                state = "active" if record.active else "revoked"
                print(
                    f"{record.key_id:<13} {record.tenant:<20} {','.join(record.scopes):<20} {state:<8} {created} {record.name}"
                )
        else:
            revoked = await keys.revoke(args.key_id)
            if revoked is None:
                print(
                    f"brimful keys: no key with id {args.key_id!r} (give the whole 12-character id `list` shows)",
                    file=sys.stderr,
                )
                return 1
            print(f"revoked {revoked.key_id} (tenant {revoked.tenant})")
    finally:
        await redis.aclose()
    return 0
