"""The floor every other package stands on: typed errors, the dimension vocabulary and mode
``Literal`` types, argument checks, statistics (intervals, resampling, verdicts on claims,
known-effect controls) and the rank helpers of ``torch.distributed``. Imports nothing of
homoglens above it.
"""
