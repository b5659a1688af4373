"""``brimful dlq``: inspect, replay, purge and export dead letters.

    brimful dlq list [--since 2h] [--class model_error] [--model M] [--all] [--limit N] [--after ID]
    brimful dlq show ID                   # an entry id (partition-offset) or a task id
    brimful dlq replay ID... | --since 2h [--class C] [--model M] [--dry-run]
    brimful dlq purge  ID... | --since 2h [--class C] [--model M] --yes
    brimful dlq export --out dlq.parquet [filters]

Replay and purge work a page at a time (the API's page limit), showing progress, so a DLQ
of any size is worked through in bounded memory on both sides; export is streamed.
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


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    listing.add_argument("--limit", type=int, default=100, help="entries to show (default 100)")
    listing.add_argument("--after", help="start at this entry id (the 'next page' a listing names)")
    show = actions.add_parser("show", help="one entry in full")
    add_api_argument(show)
    show.add_argument("id", help="entry id (partition-offset) or task id")
    replay = actions.add_parser("replay", help="send entries back to the requests topic (same task ids)")
    with_filters(replay, ids=True)
    replay.add_argument("--dry-run", action="store_true", help="say what would be replayed; change nothing")
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
    if not listing["entries"] and not listing.get("count"):
        return "no dead letters match"
    if "count" in listing:
        lines = [
            f"{listing['count']} dead letter(s): " + ", ".join(f"{n} {c}" for c, n in listing["by_error_class"].items())
        ]
    else:
        lines = [f"{len(listing['entries'])} more dead letter(s)"]
    lines.append(
        f"{'failed at':<19}  {'age':>8}  {'error class':<12} {'error':<48} {'task id':<32} {'entry':<10} status"
    )
    for entry in listing["entries"]:
        message = entry["error_message"].replace("\n", " ")
        message = message if len(message) <= 48 else message[:47] + "…"
        lines.append(
            f"{_local(entry['failed_at_ms']):<19}  {_age(entry['failed_at_ms']):>8}  {entry['error_class']:<12} "
            f"{message:<48} {entry['task_id']:<32} {entry['id']:<10} {entry['status']}"
        )
    if listing.get("next"):
        lines.append(f"(more: --after {listing['next']})")
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
        lines.append(
            f"  {_local(int(attempt.get('at_ms', 0)))}  {attempt.get('error_class', '')}: {attempt.get('error_message', '')}"
        )
    if entry.get("resolution"):
        resolution = entry["resolution"]
        lines.append(f"{resolution['action']} by {resolution.get('actor') or '?'} at {_local(resolution['at_ms'])}")
    return "\n".join(lines)


# Ids printed after a replay when there are no more than this many; beyond, the count.
_IDS_SHOWN = 20


def _pages(base: str, action: str, args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    """Run a replay or purge page by page until the DLQ's end; progress on stderr.
    Returns the totals: how many were done, their ids (the first few) and what was skipped."""
    # How many match, to show progress against (one streamed count on the server).
    counted = {**_filters(args), "limit": 0}
    if "ids" in counted:
        counted["ids"] = ",".join(counted["ids"])
    total = call("GET", base, args.api_key, timeout_s=300, params=counted).get("count", 0)
    actor = {"X-Brimful-Actor": getpass.getuser()}
    done, after = 0, None
    ids: list[str] = []
    skipped: list[dict[str, Any]] = []
    while True:
        page = call(
            "POST",
            f"{base}/{action}",
            args.api_key,
            timeout_s=300,
            headers=actor,
            json={**body, **({"after": after} if after else {})},
        )
        count = page.get("replayed", page.get("purged", 0))
        done += count
        ids.extend((page.get("task_ids") or page.get("ids") or [])[: max(0, _IDS_SHOWN + 1 - len(ids))])
        skipped.extend(page.get("skipped", [])[: max(0, _IDS_SHOWN + 1 - len(skipped))])
        after = page["next"]
        if total > _IDS_SHOWN or after:
            print(f"  {done} of {total} ...", file=sys.stderr, flush=True)
        if after is None:
            return {"done": done, "ids": ids, "skipped": skipped}


def _export(base: str, args: argparse.Namespace) -> None:
    written = 0
    with httpx.stream(
        "GET",
        f"{base}/export",
        params=_filters(args),
        headers=auth_headers(args.api_key),
        timeout=httpx.Timeout(10, read=300),
    ) as response:
        if response.status_code >= 400:
            raise CommandError(f"{response.status_code}: {response.read().decode(errors='replace')}")
        with args.out.open("wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
                written += len(chunk)
    print(f"wrote {args.out} ({written} bytes)")


def run(args: argparse.Namespace) -> int:
    base = f"{args.api.rstrip('/')}/v1/admin/dlq"
    try:
        if args.action == "list":
            params = {**_filters(args), "limit": args.limit, **({"after": args.after} if args.after else {})}
            print(render_list(call("GET", base, args.api_key, timeout_s=300, params=params)))
        elif args.action == "show":
            print(render_entry(call("GET", f"{base}/{args.id}", args.api_key, timeout_s=300)))
        elif args.action == "replay":
            body = {**_filters(args), **({"dry_run": True} if args.dry_run else {})}
            result = _pages(base, "replay", args, body)
            verb = "would replay" if args.dry_run else "replayed"
            after = " (dry run: nothing was sent)" if args.dry_run else "; they read 'queued' again"
            print(f"{verb} {result['done']} task(s){after}")
            if result["done"] <= _IDS_SHOWN:
                for task_id in result["ids"]:
                    print(f"  {task_id}")
            if result["skipped"]:
                shown = ", ".join(result["skipped"][:_IDS_SHOWN])
                print(f"skipped entr(ies) with no request to send: {shown}")
        elif args.action == "purge":
            if not args.yes:
                raise CommandError("purge cannot be undone: add --yes")
            result = _pages(base, "purge", args, _filters(args))
            print(f"purged {result['done']} entr(ies)")
        else:
            _export(base, args)
    except (CommandError, httpx.HTTPError) as error:
        print(f"brimful dlq {args.action}: {error}", file=sys.stderr)
        return 1
    return 0
