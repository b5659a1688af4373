"""Where a webhook may be sent: never to this network's own machines, unless named.

A webhook URL is the caller's, and Brimful sends to it from inside the network: an
attacker could aim it at the metadata service, Redis or a private admin page (SSRF). So a
target must be ``http`` or ``https`` on a host whose every address is public: loopback,
private, link-local (the cloud metadata address among them), shared, multicast, reserved
and unspecified addresses are refused, unless the host is in
``BRIMFUL_WEBHOOK_ALLOWED_HOSTS``. The check runs when the endpoint is registered and again
before every attempt, so a name that later resolves inward is caught then.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048
# Names are resolved on threads of their own: a resolver that hangs holds these, never the
# default executor every object-store call runs on.
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-dns")
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class TargetRefused(ValueError):
    """A URL a webhook may not be sent to; the message says why."""


# IPv6 prefixes whose last 32 bits are an IPv4 address the packet is delivered to.
_CARRIES_IPV4 = (
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (deprecated), and :: and ::1
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64, well-known prefix (RFC 6052)
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # NAT64, local use (RFC 8215): never global
)
_NEVER_GLOBAL = (
    ipaddress.IPv6Network("fec0::/10"),  # site-local (deprecated, still routed inside some sites)
    ipaddress.IPv6Network("64:ff9b:1::/48"),
)


def reached_addresses(ip: IpAddress) -> list[IpAddress]:
    """The address itself, and the IPv4 addresses an IPv6 spelling delivers to: mapped,
    IPv4-compatible, NAT64, 6to4 and Teredo's client."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    found: list[IpAddress] = [ip]
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if any(ip in network for network in _CARRIES_IPV4):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def is_public(address: str) -> bool:
    """Whether an IP address, in any spelling, reaches only the public internet: every
    address it delivers to is globally routable and none is multicast."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and any(ip in network for network in _NEVER_GLOBAL):
        return False
    return all(each.is_global and not each.is_multicast for each in reached_addresses(ip))


def parse_target(url: str, allowed_hosts: frozenset[str]) -> tuple[str, int, bool]:
    """(host, port, named in the allowed hosts) of a URL a webhook may go to; TargetRefused
    for one that is not http(s), has credentials or no host."""
    if len(url) > MAX_URL_LENGTH:
        raise TargetRefused(f"the URL is longer than {MAX_URL_LENGTH} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("the URL must be http or https")
    if parts.username or parts.password:
        raise TargetRefused("the URL must not carry credentials")
    host = (parts.hostname or "").lower()
    if not host:
        raise TargetRefused("the URL has no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:
        raise TargetRefused("the URL's port is not a number from 1 to 65535") from error
    return host, port, host in allowed_hosts


def origin(url: str) -> str:
    """A webhook URL's origin, spelled one way: ``scheme://host:port``, the host lowercased
    (bracketed when an IPv6 address), the port always given; TargetRefused as ``parse_target``."""
    host, port, _ = parse_target(url, frozenset())
    shown = f"[{host}]" if ":" in host else host
    return f"{urlsplit(url).scheme}://{shown}:{port}"


async def check_target(url: str, allowed_hosts: frozenset[str]) -> None:
    """TargetRefused unless every address the URL's host resolves to now is public (or the
    host is allowed by name)."""
    host, port, allowed = parse_target(url, allowed_hosts)
    if allowed:
        return
    try:
        infos = await asyncio.get_running_loop().run_in_executor(
            _RESOLVER, functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        )
    except OSError as error:
        raise TargetRefused(f"the host {host!r} does not resolve") from error
    for info in infos:
        address = str(info[4][0])
        if not is_public(address):
            raise TargetRefused(
                f"the host {host!r} resolves to {address}, an address of this network (loopback, private, "
                "link-local or reserved); name it in BRIMFUL_WEBHOOK_ALLOWED_HOSTS to allow it"
            )
