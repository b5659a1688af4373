"""What runs inside the model server, not in Brimful's own processes.

``reference_model`` (the trivial model the tests check every result against) and
``minilm_model`` (an opt-in real model); ``model_host`` serves one of them from a real
Triton server through PyTriton (the embedded stack runs it); ``repository_server`` runs
the plain ``tritonserver`` on a model repository (``deploy/triton/models``), as production
does. The modules here import nothing of Brimful's other rooms.
"""
