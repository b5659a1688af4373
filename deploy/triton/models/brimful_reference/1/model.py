"""Triton Python-backend wrapper around Brimful's reference model.

The model's logic lives in ``model_server/reference_model.py`` of the project, which the
container holds at /opt/brimful (REFERENCE_MODEL_SOURCE overrides); this file only adapts
it. That module imports nothing but numpy and the standard library, so it is loaded from
its folder alone: the Python-backend stub need not see Brimful's installed packages.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.environ.get("REFERENCE_MODEL_SOURCE", "/opt/brimful"), "model_server"))

import triton_python_backend_utils as pb_utils
from reference_model import ReferenceModelFault, reference_infer


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                outputs = reference_infer(text)
            except ReferenceModelFault as fault:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(fault))))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, value) for name, value in outputs.items()]
                )
            )
        return responses
