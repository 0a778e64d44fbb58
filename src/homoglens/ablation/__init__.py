"""The ablation studies: positions removed (``position_ablation_study``) and massive
activations zeroed (``massive_ablation_study``), each against the intact model, with their
result and figure.
"""
