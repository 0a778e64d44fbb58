"""Models: the architecture table (the one place hook names are built), the cache and the
shipped assets, loading (a Hub name, a folder, a shipped or embedded model), model objects of
``transformers`` and nnsight wrapped for TransformerLens, the model's state read at call time,
and each family's positions.
"""
