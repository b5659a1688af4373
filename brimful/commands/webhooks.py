"""``brimful webhooks``: a tenant's webhook endpoints and deliveries (an ``admin`` key).

    brimful webhooks add URL --events task.completed,batch.completed [--description TEXT]
    brimful webhooks list
    brimful webhooks remove ID
    brimful webhooks deliveries [--dead] [--limit N]
    brimful webhooks replay ID...
    brimful webhooks callback-secret URL

``add`` prints the endpoint's signing secret, shown this once.
"""

from __future__ import annotations

import argparse
import sys

from brimful.commands.api_client import CommandError, add_api_argument, call


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("webhooks", help="webhook endpoints, deliveries and replays")
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="register an endpoint (prints its secret)")
    add.add_argument("url")
    add.add_argument("--events", required=True, help="comma-separated: task.completed, batch.completed, ...")
    add.add_argument("--description", default="")
    listing = actions.add_parser("list", help="the endpoints")
    remove = actions.add_parser("remove", help="remove an endpoint")
    remove.add_argument("endpoint_id")
    deliveries = actions.add_parser("deliveries", help="the latest deliveries, newest first")
    deliveries.add_argument("--dead", action="store_true", help="the dead ones only")
    deliveries.add_argument("--limit", type=int, default=50)
    replay = actions.add_parser("replay", help="send deliveries again now (same webhook-id)")
    replay.add_argument("delivery_ids", nargs="+", metavar="ID")
    secret = actions.add_parser("callback-secret", help="the secret that signs tasks' callbacks to a URL's origin")
    secret.add_argument("url", help="a callback URL (its origin's secret is shown)")
    for sub in (add, listing, remove, deliveries, replay, secret):
        add_api_argument(sub)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    base = f"{args.api}/v1/webhooks"
    try:
        if args.action == "add":
            events = [event.strip() for event in args.events.split(",") if event.strip()]
            body = {"url": args.url, "events": events, "description": args.description}
            endpoint = call("POST", f"{base}/endpoints", args.api_key, json=body)
            print(f"{endpoint['id']} {endpoint['url']} {','.join(endpoint['events'])}")
            print(f"secret: {endpoint['secret']}  (shown once: keep it with the receiver)")
        elif args.action == "list":
            for endpoint in call("GET", f"{base}/endpoints", args.api_key)["data"]:
                print(f"{endpoint['id']} {endpoint['url']} {','.join(endpoint['events'])} {endpoint['description']}")
        elif args.action == "remove":
            call("DELETE", f"{base}/endpoints/{args.endpoint_id}", args.api_key)
            print(f"{args.endpoint_id} removed")
        elif args.action == "deliveries":
            params = {"limit": args.limit, **({"state": "dead"} if args.dead else {})}
            print(f"{'id':<29} {'event':<16} {'state':<10} {'attempts':>8} {'status':>6}  error")
            for delivery in call("GET", f"{base}/deliveries", args.api_key, params=params)["data"]:
                print(
                    f"{delivery['id']:<29} {delivery['event_type']:<16} {delivery['state']:<10} "
                    f"{delivery['attempts']:>8} {delivery['last_status'] or '-':>6}  {delivery['last_error'] or ''}"
                )
        elif args.action == "replay":
            for delivery_id in args.delivery_ids:
                print(f"{call('POST', f'{base}/deliveries/{delivery_id}/replay', args.api_key)['id']} pending")
        else:
            print(call("GET", f"{base}/callback-secret", args.api_key, params={"url": args.url})["secret"])
    except CommandError as error:
        print(f"brimful webhooks: {error}", file=sys.stderr)
        return 1
    return 0
