"""Brimful's wire contracts (protobuf), generated from ``schemas/brimful.proto``.

Offers ``TaskRequest`` (what the API puts on the requests topic), ``InputTensor``
(one input row of a task), ``DeadLetter`` and ``Attempt`` (what lands on the DLQ).
"""

from brimful.schemas.brimful_pb2 import Attempt, DeadLetter, InputTensor, TaskRequest

__all__ = ["Attempt", "DeadLetter", "InputTensor", "TaskRequest"]
