"""The batcher process (``python -m brimful.batcher``, assembled in ``main``): a
consumer-group member (``service``) that takes records in (``intake``), keeps one
accumulator per assigned partition (``partition_state``, with its offsets and their
commits; ``accumulator``), decides when each batch leaves (``policy``; pure, on an
injected clock), sends it out on a leased slot and follows it until it ends, pausing
through model outages (``dispatch``). ``simulator`` replays recorded arrival traces
(``traces``) through the same policy objects."""
