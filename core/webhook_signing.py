"""Signing webhook deliveries as the Standard Webhooks specification says, so any of its
verifiers (the ``standardwebhooks`` libraries, Svix's) checks them unmodified.

A secret is ``whsec_`` and the base64 of 32 random bytes; a delivery carries
``webhook-id`` (the same on every attempt, so a receiver drops repeats),
``webhook-timestamp`` (unix seconds of this attempt) and ``webhook-signature``: ``v1,``
and the base64 HMAC-SHA256, under the secret's bytes, of ``{id}.{timestamp}.{body}``.
While an endpoint's secret rotates, a delivery carries a signature under each secret,
space-separated, as the specification allows: a receiver holding either verifies it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def derived_secret(master: str, scope: str) -> str:
    """A secret of its own for ``scope`` (a callback URL's origin), from a ``master`` secret
    that is never shown: HMAC-SHA256 of the scope under the master's bytes. Holding one
    scope's secret tells nothing of another's, nor of the master."""
    key = base64.b64decode(master.removeprefix(SECRET_PREFIX))
    derived = hmac.new(key, b"callback-origin:" + scope.encode(), hashlib.sha256).digest()
    return SECRET_PREFIX + base64.b64encode(derived).decode("ascii")


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value of one attempt."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = message_id.encode() + b"." + str(timestamp).encode() + b"." + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")


def signed_headers(keys: Sequence[str], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one attempt, signed under each secret of ``keys``, the content type among them."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(secret, message_id, timestamp, body) for secret in keys),
        "content-type": "application/json",
    }
