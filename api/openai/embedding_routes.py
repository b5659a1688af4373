"""``POST /v1/embeddings`` in OpenAI's schema: each input becomes a task of the embedding
model, batched with every other caller's rows, and the call answers once they are all done.

The tasks are ordinary ones (admitted, rate-limited, recorded, cached and retried like any
other), so an embeddings call fills the same fixed batches as ``POST /v1/tasks``. The call
holds one of its tenant's waiting places and watches every task before submitting it, so
no result slips by; it waits at most ``long_poll_max_s``. What then is unfinished keeps
running: the answer is 504, and the same call again is answered from the result cache as
the rows finish. A failed row fails the call (502), naming the input and why.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack

from fastapi import APIRouter, Depends, Request

from brimful.api.http.bodies import JsonAnswer, parse_json, read_body
from brimful.api.http.guards import Principal, requires
from brimful.api.openai.embedding_answer import EmbeddingShape, embeddings_answer
from brimful.api.openai.embedding_request import EMBEDDINGS_PATH, parse_embedding_request
from brimful.api.openai.token_ids import holds_token_ids, token_vocabulary
from brimful.api.state import api_state
from brimful.api.tasks.submitter import Submitter, new_task_id, served_catalogue
from brimful.core.api_keys import Scope

router = APIRouter(tags=["openai"])

# An embeddings call carries many texts: its body may be as large as a bulk submission's.
BODY_LIMIT_FACTOR = 4


@router.post(EMBEDDINGS_PATH)
async def create_embeddings(request: Request, principal: Principal = Depends(requires(Scope.SUBMIT))) -> JsonAnswer:
    """OpenAI's embeddings call: a vector for each input, in order, with ``usage``."""
    state = api_state(request)
    settings = state.settings
    document = parse_json(
        await read_body(request, settings.max_body_bytes * BODY_LIMIT_FACTOR, settings.api_read_timeout_s)
    )
    vocabulary = None
    if settings.embedding_token_encoding and holds_token_ids(document):
        vocabulary = await token_vocabulary(settings.embedding_token_encoding)
    ask = parse_embedding_request(document, await served_catalogue(state), settings.max_bulk_tasks, vocabulary)
    task_ids = [new_task_id() for _ in ask.submissions]
    tenant = principal.tenant
    deadline = time.monotonic() + settings.long_poll_max_s
    with state.waiters.holding(tenant), ExitStack() as watching:
        finished = [watching.enter_context(state.waiters.watch(task_id)) for task_id in task_ids]
        refusals = await Submitter(state, principal).submit_each(list(zip(task_ids, ask.submissions)))
        refused = next((refusal for refusal in refusals if refusal is not None), None)
        if refused is not None:  # the inputs accepted still run; their results are cached
            raise refused
        records = await asyncio.gather(
            *(
                state.waiters.wait_final(task_id, tenant, future, deadline)
                for task_id, future in zip(task_ids, finished)
            )
        )
    answer = embeddings_answer(EmbeddingShape.of(ask), task_ids, records)
    for task_id in task_ids:
        state.read_results.note(task_id)
    return JsonAnswer(answer)
