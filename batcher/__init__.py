"""The batcher process (``python -m brimful.batcher``): a consumer-group member
(``service``) that takes records in (``intake``), keeps one accumulator per assigned
partition (``partition_state``, ``accumulator``), decides when each batch leaves
(``policy``, and ``backfill`` for low-priority rows; pure, on an injected clock), hands
batches to the workers, pauses through model outages (``model_health``), and commits only
offsets that are safe (``offsets``, ``offset_committer``). ``simulator`` replays recorded
arrival traces (``traces``) through the same policy objects."""
