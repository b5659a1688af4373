"""``brimful dlq``: inspect, replay, purge and export dead letters.

    brimful dlq list [--since 2h] [--class model_error] [--model M] [--all]
    brimful dlq show ID                   # an entry id (partition-offset) or a task id
    brimful dlq replay ID... | --since 2h [--class C] [--model M]
    brimful dlq purge  ID... | --since 2h [--class C] [--model M] --yes
    brimful dlq export --out dlq.parquet [filters]
"""

from __future__ import annotations

import argparse
import getpass
import re
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from brimful.commands.api_client import CommandError, add_api_argument, auth_headers, call

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def when_to_ms(text: str) -> int:
    """'90m', '2h', '1d' ago; an ISO date-time; or epoch milliseconds."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return int((time.time() - float(relative.group(1)) * _UNIT_S[relative.group(2)]) * 1000)
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError as error:
        raise CommandError(f"cannot read time {text!r}: use 90m, 2h, 1d, an ISO date-time or epoch ms") from error


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("dlq", help="inspect, replay, purge or export dead letters")
    actions = parser.add_subparsers(dest="action", required=True)

    def with_filters(sub: argparse.ArgumentParser, ids: bool) -> None:
        add_api_argument(sub)
        if ids:
            sub.add_argument("ids", nargs="*", metavar="ID", help="entry ids (partition-offset) or task ids")
        sub.add_argument("--since", help="failed after: 90m, 2h, 1d, ISO time or epoch ms")
        sub.add_argument("--until", help="failed before: same forms as --since")
        sub.add_argument("--class", dest="error_class", help="error class, e.g. model_error, unavailable")
        sub.add_argument("--model", help="model name")

    listing = actions.add_parser("list", help="open entries, counted by error class, then a table")
    with_filters(listing, ids=False)
    listing.add_argument("--all", action="store_true", help="include replayed and purged entries")
    show = actions.add_parser("show", help="one entry in full")
    add_api_argument(show)
    show.add_argument("id", help="entry id (partition-offset) or task id")
    replay = actions.add_parser("replay", help="send entries back to the requests topic (same task ids)")
    with_filters(replay, ids=True)
    purge = actions.add_parser("purge", help="mark entries purged")
    with_filters(purge, ids=True)
    purge.add_argument("--yes", action="store_true", help="needed: purging cannot be undone")
    export = actions.add_parser("export", help="write entries to a Parquet file")
    with_filters(export, ids=False)
    export.add_argument("--all", action="store_true", help="include replayed and purged entries")
    export.add_argument("--out", type=Path, required=True)
    parser.set_defaults(handler=run)


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    if args.since:
        filters["since_ms"] = when_to_ms(args.since)
    if args.until:
        filters["until_ms"] = when_to_ms(args.until)
    if args.error_class:
        filters["error_class"] = args.error_class
    if args.model:
        filters["model"] = args.model
    if getattr(args, "ids", None):
        filters["ids"] = args.ids
    if getattr(args, "all", False):
        filters["all"] = "true"
    return filters


def _age(ms: int) -> str:
    seconds = max(0, time.time() - ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _local(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def render_list(listing: Mapping[str, Any]) -> str:
    if not listing["count"]:
        return "no dead letters match"
    lines = [f"{listing['count']} dead letter(s): " + ", ".join(f"{n} {c}" for c, n in listing["by_error_class"].items())]
    lines.append(f"{'failed at':<19}  {'age':>8}  {'error class':<12} {'error':<48} {'task id':<32} {'entry':<10} status")
    for entry in listing["entries"]:
        message = entry["error_message"].replace("\n", " ")
        message = message if len(message) <= 48 else message[:47] + "…"
        lines.append(
            f"{_local(entry['failed_at_ms']):<19}  {_age(entry['failed_at_ms']):>8}  {entry['error_class']:<12} "
            f"{message:<48} {entry['task_id']:<32} {entry['id']:<10} {entry['status']}"
        )
    return "\n".join(lines)


def render_entry(entry: Mapping[str, Any]) -> str:
    letter = entry["letter"]
    lines = [
        f"ERROR   {entry['error_class']}: {entry['error_message']}",
        f"task    {entry['task_id']}   (entry {entry['id']}, {entry['status']})",
        f"failed  {_local(entry['failed_at_ms'])} ({_age(entry['failed_at_ms'])})",
        f"model   {entry['model']} version {letter.get('model_version', '') or '?'}",
        f"from    partition {letter.get('source_partition', 0)} offset {letter.get('source_offset', 0)}",
        f"batch   {entry['batch_id']} with {len(letter.get('batch_task_ids', []))} task(s)",
        f"attempts ({len(letter.get('attempts', []))}):",
    ]
    for attempt in letter.get("attempts", []):
        lines.append(f"  {_local(int(attempt.get('at_ms', 0)))}  {attempt.get('error_class', '')}: {attempt.get('error_message', '')}")
    if entry.get("resolution"):
        resolution = entry["resolution"]
        lines.append(f"{resolution['action']} by {resolution.get('actor') or '?'} at {_local(resolution['at_ms'])}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    base = f"{args.api.rstrip('/')}/v1/admin/dlq"
    actor = {"X-Brimful-Actor": getpass.getuser()}
    try:
        if args.action == "list":
            print(render_list(call("GET", base, args.api_key, params=_filters(args))))
        elif args.action == "show":
            print(render_entry(call("GET", f"{base}/{args.id}", args.api_key)))
        elif args.action == "replay":
            result = call("POST", f"{base}/replay", args.api_key, json=_filters(args), headers=actor)
            print(f"replayed {result['replayed']} task(s); they read 'queued' again")
            for task_id in result["task_ids"]:
                print(f"  {task_id}")
            if result["skipped"]:
                print(f"skipped {len(result['skipped'])} entr(ies) with no request to send: {', '.join(result['skipped'])}")
        elif args.action == "purge":
            if not args.yes:
                raise CommandError("purge cannot be undone: add --yes")
            result = call("POST", f"{base}/purge", args.api_key, json=_filters(args), headers=actor)
            print(f"purged {result['purged']} entr(ies)")
        else:
            response = httpx.get(f"{base}/export", params=_filters(args), headers=auth_headers(args.api_key), timeout=60)
            if response.status_code >= 400:
                raise CommandError(f"{response.status_code}: {response.text}")
            args.out.write_bytes(response.content)
            print(f"wrote {args.out}")
    except (CommandError, httpx.HTTPError) as error:
        print(f"brimful dlq {args.action}: {error}", file=sys.stderr)
        return 1
    return 0
