"""A batch's place at one model endpoint, as the pool hands it out."""

from __future__ import annotations

from dataclasses import dataclass

from brimful.workers.endpoint_pool import Endpoint
from brimful.workers.triton_model import TritonModel


@dataclass
class Slot:
    """A batch's place at one endpoint."""

    endpoint: Endpoint
    model: TritonModel
    held_since: float  # taken then; once its call begins, then (the pool plans the endpoint's end from it)
    holder: str
    leased: bool = False
    freed: bool = False  # given back here: a second give-back must not free another batch's place


class NoSlotInTime(Exception):
    """No slot of a serving pool was taken or given back within ``slot_wait_s``: something
    holds them that should not (the batch is run again, and given up to the DLQ if it keeps
    failing)."""
