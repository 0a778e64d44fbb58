"""Position-resolved similarity (``positional_similarity``): the distance-matched edge
readings, their passes and maths, the ``PositionalSimilarity`` result, its merge, tables and
figures, and the calibrated edge readings against a reference (``calibrated_readings``).
"""
