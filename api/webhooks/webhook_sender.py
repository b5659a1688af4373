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

No receiver holds up another's deliveries: each attempt runs on its own (at most
``MOST_IN_FLIGHT`` in a worker, claimed as places free, never waiting for a group), and
one endpoint has at most ``MOST_PER_ENDPOINT`` attempts under way in a worker, one tenant
``MOST_PER_TENANT``; a delivery claimed past those is due again ``DEFER_MS`` later. So a
tenant whose receivers never answer holds its own places only, each for at most the
attempt's timeout, and another tenant's delivery is tried as soon as it is due.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter

import httpx
from redis.exceptions import RedisError

from brimful.core import metrics
from brimful.core.settings import Settings
from brimful.core.webhook_records import CALLBACK, ENDPOINT_DISABLED, Delivery, Endpoint, WebhookRecords
from brimful.core.webhook_retries import disables, failing_too_long, next_attempt_ms, retry_after_s, throttles
from brimful.core.webhook_signing import signed_headers
from brimful.core.webhook_targets import TargetRefused, check_target

log = logging.getLogger("brimful.api")

TICK_S = 0.2  # how often a worker with room looks for due deliveries, when none was due
CLAIM_MOST = 32  # deliveries one look claims
MOST_IN_FLIGHT = 128  # attempts under way in one worker
MOST_PER_TENANT = 32  # of them, one tenant's
MOST_PER_ENDPOINT = 4  # of them, to one endpoint (or one callback URL)
DEFER_MS = 250  # a delivery claimed past those bounds is due again this much later
MAX_ANSWER_BYTES = 64 * 1024  # of a receiver's answer: read, then dropped
MOST_THROTTLED = 10_000  # targets this worker holds back at once (the oldest let go past it)


class WebhookSender:
    """This worker's share of the deliveries."""

    def __init__(self, settings: Settings, records: WebhookRecords, allowed_hosts: frozenset[str]) -> None:
        """``allowed_hosts``: those a delivery may reach inside the network (``ApiState.webhook_hosts``)."""
        self._settings = settings
        self._records = records
        self._allowed = allowed_hosts
        self._lease_ms = int((settings.webhook_timeout_s + 5) * 1000)
        self._attempts: set[asyncio.Task[None]] = set()
        self._by_tenant: Counter[str] = Counter()  # attempts under way
        self._by_target: Counter[str] = Counter()
        self._throttled: dict[str, int] = {}  # target -> until when (ms) its deliveries wait
        self._random = random.random

    async def run(self) -> None:
        """For the life of the process: claim due deliveries while there is room, each
        attempt on its own."""
        timeout = httpx.Timeout(self._settings.webhook_timeout_s)
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as http:
            try:
                while True:
                    await self._claim_more(http)
            finally:
                for attempt in self._attempts:
                    attempt.cancel()

    async def _claim_more(self, http: httpx.AsyncClient) -> None:
        room = MOST_IN_FLIGHT - len(self._attempts)
        if room <= 0:
            await asyncio.wait(self._attempts, return_when=asyncio.FIRST_COMPLETED)
            return
        due: list[str] = []
        try:
            due = await self._records.claim_due(min(room, CLAIM_MOST), self._lease_ms)
        except RedisError as error:
            log.warning("webhooks: Redis failed; retrying", extra={"error": str(error)})
        for delivery_id in due:
            attempt = asyncio.create_task(self._attempt_guarded(http, delivery_id))
            self._attempts.add(attempt)
            attempt.add_done_callback(self._attempts.discard)
        if not due:
            await asyncio.sleep(TICK_S)

    async def _attempt_guarded(self, http: httpx.AsyncClient, delivery_id: str) -> None:
        try:
            await self._attempt(http, delivery_id)
        except RedisError as error:  # left claimed: due again once its lease ends
            log.warning("webhooks: Redis failed during an attempt", extra={"error": str(error)})
        except Exception:
            log.exception("webhooks: an attempt failed", extra={"delivery_id": delivery_id})

    async def _attempt(self, http: httpx.AsyncClient, delivery_id: str) -> None:
        delivery = await self._records.delivery(delivery_id)
        if delivery is None or delivery.state != "pending":
            return
        target = delivery.url or delivery.endpoint_id
        now_ms = int(time.time() * 1000)
        if self._throttled.get(target, 0) > now_ms:  # its receiver asked for a pause
            await self._records.defer(delivery_id, self._throttled[target])
            return
        if self._by_tenant[delivery.tenant] >= MOST_PER_TENANT or self._by_target[target] >= MOST_PER_ENDPOINT:
            await self._records.defer(delivery_id, now_ms + DEFER_MS)
            return
        self._by_tenant[delivery.tenant] += 1
        self._by_target[target] += 1
        try:
            await self._send(http, delivery)
        finally:
            for counter, key in ((self._by_tenant, delivery.tenant), (self._by_target, target)):
                counter[key] -= 1
                if not counter[key]:
                    del counter[key]

    async def _send(self, http: httpx.AsyncClient, delivery: Delivery) -> None:
        endpoint = None
        if delivery.endpoint_id == CALLBACK:
            try:
                url, keys = delivery.url, [await self._records.callback_secret(delivery.tenant, delivery.url)]
            except TargetRefused as error:  # checked at submission: only a record written otherwise
                await self._failed(delivery, None, 0, f"refused target: {error}", None)
                return
        else:
            endpoint = await self._records.endpoint(delivery.endpoint_id, delivery.tenant)
            if endpoint is None or endpoint.disabled:
                await self._end(
                    delivery, "dead", 0, "the endpoint is disabled" if endpoint else "the endpoint was deleted"
                )
                return
            url, keys = endpoint.url, endpoint.signing_secrets(time.time())
        delivery.attempts += 1
        try:
            status, retry_after = await asyncio.wait_for(
                self._post_checked(http, url, keys, delivery), self._settings.webhook_timeout_s
            )
        except TargetRefused as error:
            await self._failed(delivery, endpoint, 0, f"refused target: {error}", None)
            return
        except (httpx.HTTPError, TimeoutError, OSError) as error:
            await self._failed(delivery, endpoint, 0, f"{type(error).__name__}: {error}"[:300], None)
            return
        if 200 <= status < 300:
            await self._end(delivery, "delivered", status, "")
            if endpoint is not None and endpoint.failing_since_ms:
                await self._records.note_success(endpoint.endpoint_id)
        elif endpoint is not None and disables(status):
            await self._end(delivery, "dead", status, f"the receiver answered {status}: the endpoint is disabled")
            await self._disable(endpoint, f"the receiver answered {status} Gone")
        else:
            await self._failed(delivery, endpoint, status, f"the receiver answered {status}", retry_after)

    async def _post_checked(
        self, http: httpx.AsyncClient, url: str, keys: list[str], delivery: Delivery
    ) -> tuple[int, str | None]:
        """The URL checked again (its name resolved now), then the signed POST: both within
        the attempt's timeout. The answer's status and Retry-After."""
        await check_target(url, self._allowed)
        headers = signed_headers(keys, delivery.delivery_id, int(time.time()), delivery.payload)
        return await _post(http, url, delivery.payload, headers)

    async def _failed(
        self, delivery: Delivery, endpoint: Endpoint | None, status: int, error: str, retry_after: str | None
    ) -> None:
        settings, now_ms = self._settings, int(time.time() * 1000)
        wait_s = retry_after_s(retry_after, now_ms / 1000)
        at_ms = next_attempt_ms(
            delivery.attempts, settings.webhook_delays_s, delivery.created_at_ms, settings.webhook_retry_window_s,
            now_ms, wait_s, self._random,
        )  # fmt: skip
        if throttles(status):
            self._throttle(delivery.url or delivery.endpoint_id, at_ms or now_ms + int((wait_s or 1.0) * 1000))
        if endpoint is not None:
            # Read with the endpoint just before this attempt: a spell already on costs no call.
            since = endpoint.failing_since_ms or await self._records.note_failure(endpoint.endpoint_id, now_ms)
            if failing_too_long(since, now_ms, settings.webhook_disable_after_s):
                await self._disable(endpoint, f"its deliveries failed for {settings.webhook_disable_after_s:g} s")
        if at_ms is None:
            await self._end(delivery, "dead", status, error)
            return
        delivery.last_status, delivery.last_error, delivery.next_at_ms = status, error, at_ms
        metrics.WEBHOOK_ATTEMPTS.labels("failed").inc()
        await self._records.record_attempt(delivery)

    def _throttle(self, target: str, until_ms: int) -> None:
        """Hold the target's other deliveries in this worker until ``until_ms``."""
        if len(self._throttled) >= MOST_THROTTLED:
            now_ms = int(time.time() * 1000)
            self._throttled = {key: at for key, at in self._throttled.items() if at > now_ms}
            while len(self._throttled) >= MOST_THROTTLED:
                del self._throttled[next(iter(self._throttled))]
        self._throttled[target] = max(until_ms, self._throttled.get(target, 0))

    async def _disable(self, endpoint: Endpoint, reason: str) -> None:
        """Disable the endpoint, and tell the tenant's endpoints that take it (once)."""
        if not await self._records.disable(endpoint, reason):
            return
        metrics.WEBHOOK_ENDPOINTS_DISABLED.inc()
        log.warning("webhook endpoint disabled", extra={"endpoint_id": endpoint.endpoint_id, "reason": reason})
        shown = {**endpoint.shown(), "disabled": True, "disabled_reason": reason}
        event_id = f"{endpoint.endpoint_id}:disabled:{time.time_ns()}"
        await self._records.emit(endpoint.tenant, ENDPOINT_DISABLED, shown, event_id)

    async def _end(self, delivery: Delivery, state: str, status: int, error: str) -> None:
        delivery.state, delivery.last_status, delivery.last_error = state, status, error
        metrics.WEBHOOK_ATTEMPTS.labels(state).inc()
        await self._records.record_attempt(delivery)
        if state == "dead":
            log.warning(
                "webhook delivery dead",
                extra={"delivery_id": delivery.delivery_id, "event_type": delivery.event_type, "error": error},
            )


async def _post(http: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
    """POST and read at most MAX_ANSWER_BYTES of the answer; its status and Retry-After."""
    async with http.stream("POST", url, content=body, headers=headers) as answer:
        read = 0
        async for chunk in answer.aiter_raw():
            read += len(chunk)
            if read >= MAX_ANSWER_BYTES:
                break
        return answer.status_code, answer.headers.get("retry-after")
