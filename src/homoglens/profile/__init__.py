"""The homogenization profile (``homogenization_profile``): token homogenization per residual
entry and position, streamed over a corpus; its mergeable sums, the effective-rank and
position-dot maths, the ``HomogenizationProfile`` result, its tables, storage and figures.
"""
