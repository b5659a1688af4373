"""What the model pool can take now: the contract between the workers' endpoint pool,
which measures it, and the batcher's flush policy, which plans with it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolCapacity:
    """The model pool as the flush policy sees it at one moment."""

    free_slots: int  # calls the pool can start now
    next_free_in: float  # seconds until a busy slot is expected to free (0 when one is free)
    call_time: float  # expected seconds of one call with a full batch
    # Expected seconds of a task's latency spent outside its batch and the call: from its
    # submit to the batcher (the API's write, the Kafka hop) and from the call's end to its
    # stored result. The live batcher measures it; 0 where nobody does (the simulator).
    around_call: float = 0.0
