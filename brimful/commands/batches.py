"""``brimful batches``: run a JSONL file as a batch job and follow it to its end.

    brimful batches create FILE --endpoint /v1/tasks [--window 24h] [--invalid-lines fail|error_file]
                           [--wait] [--out DIR]
    brimful batches list [--limit N]
    brimful batches show ID
    brimful batches wait ID [--out DIR]     # a progress bar until it ends, then its files
    brimful batches cancel ID
    brimful batches retry ID [--wait] [--out DIR]   # its failed lines again, as a new job

``create`` uploads the file (streamed: its size does not matter here) and creates the job;
with ``--wait`` it follows it like ``wait``. ``wait`` draws the job's progress on stderr
once a second until it ends, then saves its output and error files in ``--out`` (default:
the current folder) and exits 0 if it completed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from brimful.commands.api_client import CommandError, add_api_argument, auth_headers, call

FINAL = ("completed", "failed", "expired", "cancelled")
POLL_S = 1.0
BAR_WIDTH = 30


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("batches", help="run a JSONL file as a batch job (OpenAI's Batch API)")
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="upload a JSONL file and start a batch job on it")
    create.add_argument("file", type=Path)
    create.add_argument("--endpoint", required=True, choices=["/v1/tasks", "/v1/embeddings"])
    create.add_argument("--window", default="24h", help="completion window: 24h, or shorter (90s, 30m, 2h)")
    create.add_argument(
        "--invalid-lines",
        choices=["fail", "error_file"],
        default="fail",
        help="fail: a file with an invalid line fails at validating, its errors listing them (OpenAI's way); "
        "error_file: the valid lines run, each invalid one answered in the error file",
    )
    create.add_argument("--wait", action="store_true", help="follow it to its end, then save its files")
    create.add_argument("--out", type=Path, default=Path("."), help="where --wait saves the files")
    listing = actions.add_parser("list", help="your batch jobs, newest first")
    listing.add_argument("--limit", type=int, default=20)
    show = actions.add_parser("show", help="one batch job")
    show.add_argument("batch_id")
    wait = actions.add_parser("wait", help="follow a batch job to its end, then save its files")
    wait.add_argument("batch_id")
    wait.add_argument("--out", type=Path, default=Path("."))
    cancel = actions.add_parser("cancel", help="cancel a batch job")
    cancel.add_argument("batch_id")
    retry = actions.add_parser("retry", help="run an ended batch job's failed lines again, as a new job")
    retry.add_argument("batch_id")
    retry.add_argument("--wait", action="store_true", help="follow the new job to its end, then save its files")
    retry.add_argument("--out", type=Path, default=Path("."), help="where --wait saves the files")
    for sub in (create, listing, show, wait, cancel, retry):
        add_api_argument(sub)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _ACTIONS[args.action](args)
    except CommandError as error:
        print(f"brimful batches: {error}", file=sys.stderr)
        return 1


def _create(args: argparse.Namespace) -> int:
    if not args.file.is_file():
        raise CommandError(f"no file {args.file}")
    try:
        with args.file.open("rb") as content:
            answer = httpx.post(
                f"{args.api}/v1/files",
                files={"file": (args.file.name, content, "application/jsonl")},
                data={"purpose": "batch"},
                headers=auth_headers(args.api_key),
                timeout=httpx.Timeout(60.0, write=None),
            )
    except httpx.HTTPError as error:
        raise CommandError(f"cannot reach {args.api}: {error}") from error
    if answer.status_code != 200:
        raise CommandError(f"{answer.status_code}: {answer.json().get('error', {}).get('message', answer.text)}")
    file_id = answer.json()["id"]
    batch = call(
        "POST",
        f"{args.api}/v1/batches",
        args.api_key,
        json={
            "input_file_id": file_id,
            "endpoint": args.endpoint,
            "completion_window": args.window,
            "invalid_lines": args.invalid_lines,
        },
    )
    print(batch["id"])
    if args.wait:
        args.batch_id = batch["id"]
        return _wait(args)
    return 0


def _list(args: argparse.Namespace) -> int:
    page = call("GET", f"{args.api}/v1/batches", args.api_key, params={"limit": args.limit})
    print(f"{'id':<31} {'status':<11} {'endpoint':<15} {'done':>7} {'failed':>7} {'total':>7}")
    for batch in page["data"]:
        counts = batch["request_counts"]
        print(
            f"{batch['id']:<31} {batch['status']:<11} {batch['endpoint']:<15} "
            f"{counts['completed']:>7} {counts['failed']:>7} {counts['total']:>7}"
        )
    return 0


def _show(args: argparse.Namespace) -> int:
    batch = call("GET", f"{args.api}/v1/batches/{args.batch_id}", args.api_key)
    for name, value in batch.items():
        if value is not None:
            print(f"{name:<18} {value}")
    return 0


def progress_line(batch: dict[str, Any]) -> str:
    """One line of progress: the bar, the lines done of the total, the state."""
    counts = batch["request_counts"]
    done, total = counts["completed"] + counts["failed"], counts["total"]
    filled = int(BAR_WIDTH * done / total) if total else 0
    share = f"{100 * done / total:5.1f}%" if total else "  ...."
    return (
        f"{batch['id']} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share} "
        f"{done}/{total or '?'} ({counts['failed']} failed) {batch['status']}"
    )


def _wait(args: argparse.Namespace) -> int:
    while True:
        batch = call("GET", f"{args.api}/v1/batches/{args.batch_id}", args.api_key)
        print("\r" + progress_line(batch), end="", file=sys.stderr, flush=True)
        if batch["status"] in FINAL:
            print(file=sys.stderr)
            break
        time.sleep(POLL_S)
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in ("output_file_id", "error_file_id"):
        if batch.get(kind):
            path = args.out / f"{batch['id']}_{kind.split('_')[0]}.jsonl"
            _download(args, batch[kind], path)
            print(f"saved {path}")
    return 0 if batch["status"] == "completed" else 1


def _download(args: argparse.Namespace, file_id: str, path: Path) -> None:
    try:
        with httpx.stream(
            "GET", f"{args.api}/v1/files/{file_id}/content", headers=auth_headers(args.api_key), timeout=60
        ) as answer:
            if answer.status_code != 200:
                raise CommandError(f"{answer.status_code}: cannot download {file_id}")
            with path.open("wb") as out:
                for chunk in answer.iter_bytes():
                    out.write(chunk)
    except httpx.HTTPError as error:
        raise CommandError(f"cannot reach {args.api}: {error}") from error


def _cancel(args: argparse.Namespace) -> int:
    batch = call("POST", f"{args.api}/v1/batches/{args.batch_id}/cancel", args.api_key)
    print(f"{batch['id']} {batch['status']}")
    return 0


def _retry(args: argparse.Namespace) -> int:
    key = {"Idempotency-Key": f"retry-{uuid.uuid4().hex}"}
    batch = call("POST", f"{args.api}/v1/batches/{args.batch_id}/retry", args.api_key, headers=key)
    print(batch["id"])
    if args.wait:
        args.batch_id = batch["id"]
        return _wait(args)
    return 0


_ACTIONS = {"create": _create, "list": _list, "show": _show, "wait": _wait, "cancel": _cancel, "retry": _retry}
