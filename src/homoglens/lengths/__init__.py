"""The length sweep (``length_study``): homogenization against the window length, its result
and figure.
"""
