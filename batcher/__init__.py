"""The batcher process (``python -m brimful.batcher``): a consumer-group member that keeps
one accumulator per assigned partition, decides when each batch leaves (``policy``, pure,
on an injected clock), hands batches to the workers, and commits only offsets that are
safe (``offsets``). ``simulator`` replays recorded arrival traces (``traces``) through the
same policy objects."""
