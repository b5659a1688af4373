"""``brimful tenants``: see and set per-tenant limits (straight in Redis, like ``keys``).

    brimful tenants list
    brimful tenants set acme [--max-payload-bytes N] [--max-in-flight N] [--max-stored-bytes N]
    brimful tenants reset acme

API replicas pick a change up within a second. 0 means no limit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import get_settings
from brimful.core.tenant_limits import TenantLimits, TenantLimitStore


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("tenants", help="see or set per-tenant payload and in-flight limits")
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the defaults and every tenant with its own limits, with tasks in flight")
    change = actions.add_parser("set", help="give a tenant its own limits (unnamed ones keep their value)")
    change.add_argument("tenant")
    change.add_argument("--max-payload-bytes", type=_non_negative, help="largest encoded task inputs; 0: none")
    change.add_argument("--max-in-flight", type=_non_negative, help="most unfinished tasks at once; 0: none")
    change.add_argument("--max-stored-bytes", type=_non_negative, help="most bytes of files kept; 0: none")
    reset = actions.add_parser("reset", help="drop a tenant's own limits: back to the defaults")
    reset.add_argument("tenant")
    parser.set_defaults(handler=run)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("a limit is 0 (none) or more")
    return value


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    settings = get_settings()
    redis = make_redis(settings)
    store = TenantLimitStore(
        redis,
        RedisKeys(settings.key_prefix),
        TenantLimits(
            settings.tenant_max_payload_bytes, settings.tenant_max_in_flight, settings.tenant_max_stored_bytes
        ),
    )
    try:
        if args.action == "list":
            print(f"{'tenant':<24} {'max payload bytes':>18} {'max in flight':>14} {'in flight':>10}")
            print(
                f"{'(default)':<24} {store.defaults.max_payload_bytes:>18} {store.defaults.max_in_flight:>14} {'':>10}"
            )
            for tenant, limits in (await store.overrides()).items():
                in_flight = await store.in_flight(tenant)
                print(f"{tenant:<24} {limits.max_payload_bytes:>18} {limits.max_in_flight:>14} {in_flight:>10}")
        elif args.action == "set":
            if args.max_payload_bytes is None and args.max_in_flight is None and args.max_stored_bytes is None:
                print(
                    "brimful tenants set: name --max-payload-bytes, --max-in-flight or --max-stored-bytes",
                    file=sys.stderr,
                )
                return 1
            limits = await store.set(args.tenant, args.max_payload_bytes, args.max_in_flight, args.max_stored_bytes)
            print(
                f"{args.tenant}: max payload {limits.max_payload_bytes} bytes, max in flight {limits.max_in_flight}, "
                f"max stored {limits.max_stored_bytes} bytes"
            )
        elif await store.reset(args.tenant):
            print(f"{args.tenant}: back to the defaults")
        else:
            print(f"brimful tenants reset: {args.tenant!r} has no limits of its own", file=sys.stderr)
            return 1
    finally:
        await redis.aclose()
    return 0
