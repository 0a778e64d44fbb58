"""Activation patching of the residual stream between an intact and an ablated run
(``activation_patching``): the pass plans, the ``PatchingResult`` and its figure.
"""
