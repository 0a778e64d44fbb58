"""homoglens: token homogenization under positional bias, measured on TransformerLens models.

The public face: everything a researcher needs is importable from here.

    >>> from homoglens import load_model, homogenization_profile
"""

from importlib import metadata as _metadata

from homoglens.core import interrupt  # first: Ctrl-C during the imports below says "Aborted!"

# isort: split
from homoglens.ablation.measure import massive_ablation_study, position_ablation_study
from homoglens.ablation.result import PositionAblationStudy
from homoglens.bias.interventions import attention_bias_hooks, biased_attention
from homoglens.bias.measure import attention_bias_study
from homoglens.bias.result import AttentionBiasStudy, SlopeAtZero
from homoglens.comparison.measure import REPLICATED_MODELS, compare_models
from homoglens.comparison.result import ModelComparison
from homoglens.core.errors import (
    DistributedError,
    HomoglensError,
    IncompatibleResultsError,
    IncompleteModelFolderError,
    InvalidInputError,
    MissingDependencyError,
    ModelFolderNotFoundError,
    ModelStateError,
    NonFiniteActivationError,
    ResultsNotFoundError,
    ResultWriteError,
    SequenceTooLongError,
    TrainingDivergedError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from homoglens.core.types import (
    ATTENTION_BIAS_KINDS,
    PATCH_COMPONENTS,
    PATCH_METRICS,
    POSITION_ABLATIONS,
    AttentionBiasKind,
    PositionAblation,
)
from homoglens.lengths.measure import length_study
from homoglens.lengths.result import LengthStudy
from homoglens.models.architectures import architecture_of, resid_hook_name
from homoglens.models.assets import EMBEDDED_MODELS, SHIPPED_MODELS, checkpoint_folders
from homoglens.models.loading import ModelInfo, load_model, model_info
from homoglens.patching.measure import positional_patching
from homoglens.patching.result import PositionalPatchingResult
from homoglens.profile.measure import cosine_homogenization, homogenization_profile
from homoglens.profile.result import HomogenizationProfile
from homoglens.reproductions.perturbation import perturbation_spread
from homoglens.reproductions.perturbation_result import PerturbationSpread
from homoglens.reproductions.rollout import attention_rollout
from homoglens.reproductions.rollout_result import AttentionRollout, uniform_causal_rollout
from homoglens.reproductions.sink_emergence import sink_emergence_study
from homoglens.reproductions.sink_emergence_result import SinkEmergence
from homoglens.reproductions.valleys import compression_valleys
from homoglens.reproductions.valleys_result import CompressionValleys
from homoglens.results import Provenance
from homoglens.run.data import TokenBatch, corpus_windows, load_corpus, to_token_batch
from homoglens.run.fast_attention import fast_attention_status
from homoglens.run.interventions import (
    ablated_massive_activations,
    ablated_positions,
    massive_activation_hooks,
    position_ablation_hooks,
)
from homoglens.similarity.calibration import (
    CalibratedReadings,
    calibrated_readings,
    random_reference,
)
from homoglens.similarity.measure import positional_similarity, similarity_from_activations
from homoglens.similarity.result import PositionalSimilarity
from homoglens.sinks import (
    ATTRIBUTION_METRICS,
    AttentionReceived,
    MassiveActivations,
    SinkAnalysis,
    SinkAttribution,
    SinkScores,
    attention_received,
    attention_view,
    find_massive_sites,
    massive_activation_means,
    massive_activations,
    sink_analysis,
    sink_attribution,
    sink_scores,
)
from homoglens.training.sweep_result import CheckpointSweep
from homoglens.training.sweeps import SWEEP_MEASURES, over_checkpoints

interrupt.uninstall()  # the imports are done: the previous sys.excepthook is back

try:  # the one version source is pyproject.toml; an installed package carries it
    __version__: str = _metadata.version("homoglens")
except _metadata.PackageNotFoundError:  # pragma: no cover - a source tree on sys.path only
    __version__ = "0+unknown"

__all__ = [
    "ATTENTION_BIAS_KINDS",
    "ATTRIBUTION_METRICS",
    "EMBEDDED_MODELS",
    "PATCH_COMPONENTS",
    "PATCH_METRICS",
    "POSITION_ABLATIONS",
    "REPLICATED_MODELS",
    "SHIPPED_MODELS",
    "SWEEP_MEASURES",
    "AttentionBiasKind",
    "AttentionBiasStudy",
    "AttentionReceived",
    "AttentionRollout",
    "CalibratedReadings",
    "CheckpointSweep",
    "CompressionValleys",
    "DistributedError",
    "HomogenizationProfile",
    "HomoglensError",
    "IncompatibleResultsError",
    "IncompleteModelFolderError",
    "InvalidInputError",
    "LengthStudy",
    "MassiveActivations",
    "MissingDependencyError",
    "ModelComparison",
    "ModelFolderNotFoundError",
    "ModelInfo",
    "ModelStateError",
    "NonFiniteActivationError",
    "PerturbationSpread",
    "PositionAblation",
    "PositionAblationStudy",
    "PositionalPatchingResult",
    "PositionalSimilarity",
    "Provenance",
    "ResultWriteError",
    "ResultsNotFoundError",
    "SequenceTooLongError",
    "SinkAnalysis",
    "SinkAttribution",
    "SinkEmergence",
    "SinkScores",
    "SlopeAtZero",
    "TokenBatch",
    "TrainingDivergedError",
    "UnknownModelError",
    "UnsupportedArchitectureError",
    "ablated_massive_activations",
    "ablated_positions",
    "architecture_of",
    "attention_bias_hooks",
    "attention_bias_study",
    "attention_received",
    "attention_rollout",
    "attention_view",
    "biased_attention",
    "calibrated_readings",
    "checkpoint_folders",
    "compare_models",
    "compression_valleys",
    "corpus_windows",
    "cosine_homogenization",
    "fast_attention_status",
    "find_massive_sites",
    "homogenization_profile",
    "length_study",
    "load_corpus",
    "load_model",
    "massive_ablation_study",
    "massive_activation_hooks",
    "massive_activation_means",
    "massive_activations",
    "model_info",
    "over_checkpoints",
    "perturbation_spread",
    "position_ablation_hooks",
    "position_ablation_study",
    "positional_patching",
    "positional_similarity",
    "random_reference",
    "resid_hook_name",
    "similarity_from_activations",
    "sink_analysis",
    "sink_attribution",
    "sink_emergence_study",
    "sink_scores",
    "to_token_batch",
    "uniform_causal_rollout",
]
