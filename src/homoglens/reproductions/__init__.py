"""Reproductions of other papers' measurements: compression valleys, sink emergence, attention
rollout and one-token perturbation spread, each an entry point beside its result.
"""
