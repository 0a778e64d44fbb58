"""Models compared on one corpus (``compare_models``): the options, the ``ModelComparison``
result, its tables, storage and figure.
"""
