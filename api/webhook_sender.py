"""Sending webhook deliveries: every API worker runs ``WebhookSender.run``, claiming due
deliveries from Redis a few at a time (a claimed one is hidden for the length of an
attempt, so a worker that dies leaves it due again: at least once).

An attempt checks the endpoint's URL again (``core/webhook_targets.py``: a name that now
resolves inward is refused), signs the body as Standard Webhooks says
(``core/webhook_signing.py``), follows no redirect, and reads at most ``MAX_ANSWER_BYTES``
of the answer within ``webhook_timeout_s``. A 2xx ends it delivered; anything else is tried
again after the next of ``webhook_retry_delays_s``, until they run out or
``webhook_retry_window_s`` has passed since the event: then it is dead, listed for on-call
to replay. A delivery whose endpoint was deleted is dead at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from redis.exceptions import RedisError

from brimful.core import metrics
from brimful.core.settings import Settings
from brimful.core.webhook_records import CALLBACK, Delivery, WebhookRecords, next_delay_s
from brimful.core.webhook_signing import signed_headers
from brimful.core.webhook_targets import TargetRefused, check_target

log = logging.getLogger("brimful.api")

TICK_S = 0.2  # how often a worker looks for due deliveries
CLAIM_MOST = 32  # deliveries one look claims
MAX_ANSWER_BYTES = 64 * 1024  # of a receiver's answer: read, then dropped


class WebhookSender:
    """This worker's share of the deliveries."""

    def __init__(self, settings: Settings, records: WebhookRecords, allowed_hosts: frozenset[str]) -> None:
        """``allowed_hosts``: those a delivery may reach inside the network (``ApiState.webhook_hosts``)."""
        self._settings = settings
        self._records = records
        self._allowed = allowed_hosts
        self._lease_ms = int((settings.webhook_timeout_s + 5) * 1000)

    async def run(self) -> None:
        """For the life of the process."""
        timeout = httpx.Timeout(self._settings.webhook_timeout_s)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as http:
            while True:
                due: list[str] = []
                try:
                    due = await self._records.claim_due(CLAIM_MOST, self._lease_ms)
                    await asyncio.gather(*(self._attempt(http, delivery_id) for delivery_id in due))
                except RedisError as error:
                    log.warning("webhooks: Redis failed; retrying", extra={"error": str(error)})
                if not due:
                    await asyncio.sleep(TICK_S)

    async def _attempt(self, http: httpx.AsyncClient, delivery_id: str) -> None:
        delivery = await self._records.delivery(delivery_id)
        if delivery is None or delivery.state != "pending":
            return
        if delivery.endpoint_id == CALLBACK:
            url, secret = delivery.url, await self._records.callback_secret(delivery.tenant)
        else:
            endpoint = await self._records.endpoint(delivery.endpoint_id, delivery.tenant)
            if endpoint is None:
                await self._end(delivery, "dead", 0, "the endpoint was deleted")
                return
            url, secret = endpoint.url, endpoint.secret
        delivery.attempts += 1
        try:
            await check_target(url, self._allowed)
            headers = signed_headers(secret, delivery.delivery_id, int(time.time()), delivery.payload)
            status = await asyncio.wait_for(
                _post(http, url, delivery.payload, headers), self._settings.webhook_timeout_s
            )
        except TargetRefused as error:
            await self._failed(delivery, 0, f"refused target: {error}")
            return
        except (httpx.HTTPError, TimeoutError, OSError) as error:
            await self._failed(delivery, 0, f"{type(error).__name__}: {error}"[:300])
            return
        if 200 <= status < 300:
            await self._end(delivery, "delivered", status, "")
        else:
            await self._failed(delivery, status, f"the receiver answered {status}")

    async def _failed(self, delivery: Delivery, status: int, error: str) -> None:
        delay = next_delay_s(delivery.attempts, self._settings.webhook_delays_s)
        now_ms = int(time.time() * 1000)
        window_ms = self._settings.webhook_retry_window_s * 1000
        if delay is None or now_ms + delay * 1000 - delivery.created_at_ms > window_ms:
            await self._end(delivery, "dead", status, error)
            return
        delivery.last_status, delivery.last_error, delivery.next_at_ms = status, error, now_ms + int(delay * 1000)
        metrics.WEBHOOK_ATTEMPTS.labels("failed").inc()
        await self._records.record_attempt(delivery)

    async def _end(self, delivery: Delivery, state: str, status: int, error: str) -> None:
        delivery.state, delivery.last_status, delivery.last_error = state, status, error
        metrics.WEBHOOK_ATTEMPTS.labels(state).inc()
        await self._records.record_attempt(delivery)
        if state == "dead":
            log.warning(
                "webhook delivery dead",
                extra={"delivery_id": delivery.delivery_id, "event_type": delivery.event_type, "error": error},
            )


async def _post(http: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST and read at most MAX_ANSWER_BYTES of the answer; its status."""
    async with http.stream("POST", url, content=body, headers=headers) as answer:
        read = 0
        async for chunk in answer.aiter_raw():
            read += len(chunk)
            if read >= MAX_ANSWER_BYTES:
                break
        return answer.status_code
