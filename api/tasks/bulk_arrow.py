"""Bulk submission as an Arrow IPC stream (``POST /v1/tasks:batch`` with
``Content-Type: application/vnd.apache.arrow.stream``): a table whose columns are the
model's inputs, a task a row, converted a column at a time (``core/arrow_columns.py``).

The model and priority come from the query (``?model=``, ``?priority=low``), as every row
shares them; the answer is the JSON bulk answer, ids in row order. The same limits hold as
for a JSON bulk submission: its body size, ``max_bulk_tasks`` rows, the tenant's rate,
payload and in-flight limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from brimful.api.http.bodies import ApiError, error_of
from brimful.api.http.guards import Principal
from brimful.api.state import ApiState
from brimful.api.tasks.submission import Submission, low_priority, model_named, queued_answer
from brimful.api.tasks.submitter import Submitter, new_task_id, served_catalogue
from brimful.core.arrow_columns import tensors_from_table
from brimful.core.arrow_stream_bounds import StreamRefused, check_stream
from brimful.core.model_catalogue import InputValidationError

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def read_table(body: bytes, max_bytes: int, max_rows: int) -> pa.Table:
    """The table an Arrow IPC stream holds, once its claims are checked against the body
    and row limits (413) and its columns are distinct UTF-8 names; 400 naming why it
    cannot be read."""
    try:
        check_stream(body, max_bytes, max_rows)
        table = pyarrow.ipc.open_stream(pa.py_buffer(body)).read_all()
        names = table.column_names
    except StreamRefused as error:
        raise ApiError(413, "arrow_too_large", str(error)) from error
    except (pa.ArrowException, OSError, MemoryError, ValueError) as error:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, "invalid_arrow", f"the body is not an Arrow IPC stream: {error}"[:300]) from error
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ApiError(400, "invalid_arrow", f"the table names a column more than once: {', '.join(repeated)}"[:300])
    return table


async def submit_arrow(
    state: ApiState, principal: Principal, body: bytes, limit_bytes: int, query: Mapping[str, str]
) -> dict[str, Any]:
    """Accept a task for each row; answered as the JSON bulk submission is."""
    limit = state.settings.max_bulk_tasks
    table = read_table(body, limit_bytes, limit)
    if table.num_rows == 0:
        raise ApiError(422, "invalid_request", "the table has no row")
    if table.num_rows > limit:
        raise ApiError(413, "too_many_tasks", f"{table.num_rows} rows exceed the limit of {limit} tasks per call")
    low = low_priority(query.get("priority", "normal"))
    signature = model_named(query.get("model"), await served_catalogue(state))
    try:
        rows = tensors_from_table(signature.inputs, table)
    except InputValidationError as error:
        raise ApiError(422, "invalid_input", str(error)) from error
    tasks = [(new_task_id(), Submission(inputs=inputs, model=signature.name, low_priority=low)) for inputs in rows]
    refusals = await Submitter(state, principal).submit_each(tasks)
    results = [
        queued_answer(task_id, signature.name) if refusal is None else error_of(refusal)
        for (task_id, _), refusal in zip(tasks, refusals)
    ]
    return {"accepted": sum(1 for result in results if "task_id" in result), "results": results}
