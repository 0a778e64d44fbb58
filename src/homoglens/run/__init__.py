"""Running a model over data: token batches and corpora (``run.data``), the streaming engine
(batches, shards, merges of sums across ranks), single forward passes, the SDPA fast path and
the blocked attention function, hook factories, interventions, next-token losses and the
provenance of a run.
"""
