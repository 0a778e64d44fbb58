"""Controlled retraining of small models over seeds (``train_controlled_models``), its
configuration, and a measure swept over training checkpoints (``over_checkpoints``) with its
result and figure.
"""
