"""``brimful tune``: read or change the flush policy of one model's running batchers.

brimful tune                          # the default model: values, defaults, recent changes
brimful tune max_wait_ms=100          # change; every batcher applies it within ~1 s
brimful tune --model NAME min_wait_ms=5   # another model's (GET /v1/models lists them)
"""

from __future__ import annotations

import argparse
import getpass
import sys
import time
from urllib.parse import quote

from brimful.commands.api_client import CommandError, add_api_argument, call


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("tune", help="read or change the live flush policy (NAME=VALUE ...)")
    add_api_argument(parser)
    parser.add_argument(
        "--model", default=None, help="the model whose policy to read or change (default: the default model)"
    )
    parser.add_argument("changes", nargs="*", metavar="NAME=VALUE", help="parameters to change, e.g. max_wait_ms=100")
    parser.set_defaults(handler=run)


def _parse(changes: list[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for change in changes:
        name, sep, value = change.partition("=")
        if not sep or not name or not value:
            raise CommandError(f"expected NAME=VALUE, got {change!r}")
        parsed[name.strip()] = value.strip()
    return parsed


def _when(at_ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at_ms / 1000))


def run(args: argparse.Namespace) -> int:
    url = f"{args.api.rstrip('/')}/v1/admin/policy"
    if args.model:
        url += f"?model={quote(args.model, safe='')}"
    try:
        if args.changes:
            entry = call(
                "PATCH", url, args.api_key, json=_parse(args.changes), headers={"X-Brimful-Actor": getpass.getuser()}
            )
            print(f"changed at {_when(entry['at_ms'])} ({args.model or 'the default model'}):")
            for name, new in entry["new"].items():
                old = entry["old"][name]
                marker = f"{old:g} -> {new:g}" if old != new else f"{new:g} (unchanged)"
                print(f"  {name:<22} {marker}")
            return 0
        state = call("GET", url, args.api_key)
    except CommandError as error:
        print(f"brimful tune: {error}", file=sys.stderr)
        return 1
    print(f"model {state.get('model', '?')}")
    print(f"  {'parameter':<22} {'now':>10} {'default':>10}")
    for name, value in state["params"].items():
        default = state["defaults"][name]
        flag = "" if value == default else "  (changed)"
        print(f"  {name:<22} {value:>10g} {default:>10g}{flag}")
    if state["history"]:
        print("recent changes, newest first:")
        for entry in state["history"][:10]:
            diffs = ", ".join(
                f"{n} {entry['old'][n]:g} -> {entry['new'][n]:g}"
                for n in entry["new"]
                if entry["old"][n] != entry["new"][n]
            )
            print(f"  {_when(entry['at_ms'])}  {entry.get('actor') or '?':<12} {diffs or 'no change'}")
    return 0
