"""The model behind the dynamic-batcher anchor, as a model of Triton's own Python backend.

Triton loads this file as ``model.py`` of the anchor's model repository
(``bench/harness/dynamic_batcher.py``); it runs in Triton's Python-backend stub, not in
this project's interpreter. Each execution takes the requests Triton's dynamic batcher
gathered, calls the model once on all their rows, waits out the model's call time (as
the model host's gpu-like model does), and answers each request with its own rows.
"""

from __future__ import annotations

import json
import site
import time
from typing import Any


class TritonPythonModel:
    """Triton's Python-backend entry points: initialize, execute, finalize."""

    def initialize(self, args: dict[str, str]) -> None:
        parameters = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        site.addsitedir(parameters["SITE_PACKAGES"])  # numpy and Brimful's model server, .pth files included
        from brimful.model_server.model_host import minilm, reference
        from brimful.model_server.reference_model import ReferenceModel

        self.call_s = float(parameters["CALL_MS"]) / 1000
        served = minilm() if parameters["MODEL"] == "minilm" else reference(ReferenceModel())
        self.call = served.call
        self.outputs = [name for name, _, _ in served.outputs]

    def execute(self, requests: list[Any]) -> list[Any]:
        import numpy as np
        import triton_python_backend_utils as pb_utils

        started = time.monotonic()
        texts = [pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy() for request in requests]
        try:
            outputs = self.call(np.concatenate(texts))
        except Exception as error:  # every request of the call is answered with the model's error
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))) for _ in requests]
        remaining = self.call_s - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
        answers, first = [], 0
        for text in texts:
            rows = slice(first, first + len(text))
            answers.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, outputs[n][rows]) for n in self.outputs])
            )
            first += len(text)
        return answers
