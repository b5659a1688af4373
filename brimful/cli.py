"""The ``brimful`` command: run the embedded stack, tune and watch a live one, simulate."""

from __future__ import annotations

import argparse
import sys

from brimful.commands import batches, dlq, keys, simulate, stats, tenants, tune, up, webhooks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brimful", description="Fill fixed-size inference batches from single requests."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (up, tune, stats, simulate, dlq, keys, tenants, batches, webhooks):
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
