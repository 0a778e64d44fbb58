"""The attention-bias study (``attention_bias_study``): the bias kinds and their hooks, the
user-facing interventions (``attention_bias_hooks``, ``biased_attention``), the passes, the
dose-response result, its slope at zero, tables and figure.
"""
