"""homoglens: token homogenization under positional bias, measured on TransformerLens models.

The public face: everything a researcher needs is importable from here.

    >>> from homoglens import load_model, homogenization_profile
"""

from importlib import metadata as _metadata

from homoglens import interrupt  # first: Ctrl-C during the imports below says "Aborted!"
from homoglens.architectures import (
    ARCHITECTURES,
    ArchitectureSpec,
    architecture_of,
    family_of,
    resid_hook_name,
)
from homoglens.assets import EMBEDDED_MODELS, SHIPPED_MODELS, checkpoint_folders
from homoglens.bias import attention_bias_study
from homoglens.calibration import CalibratedReadings, calibrated_readings, random_reference
from homoglens.comparison import REPLICATED_MODELS, compare_models
from homoglens.controls import control_activations
from homoglens.data import TokenBatch, corpus_windows, load_corpus, to_token_batch
from homoglens.errors import (
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
    SequenceTooLongError,
    TrainingDivergedError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from homoglens.fast_attention import fast_attention_status
from homoglens.hooks import PositionPlan
from homoglens.interventions import (
    ablated_massive_activations,
    ablated_positions,
    attention_bias_hooks,
    biased_attention,
    massive_activation_hooks,
    position_ablation_hooks,
)
from homoglens.lengths import length_study
from homoglens.models import ModelInfo, load_model, model_info
from homoglens.patching import positional_patching
from homoglens.profile import cosine_homogenization, homogenization_profile
from homoglens.results import HomogenizationProfile, PositionAblationStudy, Provenance
from homoglens.results.bias import AttentionBiasStudy, SlopeAtZero
from homoglens.results.comparison import ModelComparison
from homoglens.results.lengths import LengthStudy
from homoglens.results.patching import PositionalPatchingResult
from homoglens.results.similarity import PositionalSimilarity
from homoglens.results.sweeps import CheckpointSweep
from homoglens.similarity import positional_similarity, similarity_from_activations
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
from homoglens.studies import (
    default_ablation_modes,
    massive_ablation_study,
    position_ablation_study,
)
from homoglens.sweeps import SWEEP_MEASURES, over_checkpoints
from homoglens.types import (
    ATTENTION_BIAS_KINDS,
    PATCH_COMPONENTS,
    PATCH_METRICS,
    POSITION_ABLATIONS,
    AttentionBiasKind,
    PositionAblation,
)

interrupt.uninstall()  # the imports are done: the previous sys.excepthook is back

try:  # the one version source is pyproject.toml; an installed package carries it
    __version__: str = _metadata.version("homoglens")
except _metadata.PackageNotFoundError:  # pragma: no cover - a source tree on sys.path only
    __version__ = "0+unknown"

__all__ = [
    "ARCHITECTURES",
    "CalibratedReadings",
    "calibrated_readings",
    "random_reference",
    "control_activations",
    "ATTRIBUTION_METRICS",
    "CheckpointSweep",
    "PATCH_COMPONENTS",
    "PATCH_METRICS",
    "PositionalPatchingResult",
    "ArchitectureSpec",
    "EMBEDDED_MODELS",
    "DistributedError",
    "SHIPPED_MODELS",
    "SWEEP_MEASURES",
    "HomogenizationProfile",
    "HomoglensError",
    "IncompatibleResultsError",
    "IncompleteModelFolderError",
    "InvalidInputError",
    "MissingDependencyError",
    "ModelFolderNotFoundError",
    "ModelStateError",
    "ModelInfo",
    "ModelComparison",
    "POSITION_ABLATIONS",
    "ATTENTION_BIAS_KINDS",
    "AttentionBiasKind",
    "REPLICATED_MODELS",
    "PositionAblation",
    "PositionAblationStudy",
    "PositionPlan",
    "PositionalSimilarity",
    "MassiveActivations",
    "NonFiniteActivationError",
    "TrainingDivergedError",
    "Provenance",
    "ResultsNotFoundError",
    "SequenceTooLongError",
    "SinkAnalysis",
    "SinkAttribution",
    "SinkScores",
    "TokenBatch",
    "UnknownModelError",
    "UnsupportedArchitectureError",
    "AttentionBiasStudy",
    "AttentionReceived",
    "attention_received",
    "SlopeAtZero",
    "ablated_massive_activations",
    "find_massive_sites",
    "massive_ablation_study",
    "ablated_positions",
    "attention_bias_hooks",
    "attention_bias_study",
    "biased_attention",
    "checkpoint_folders",
    "architecture_of",
    "family_of",
    "fast_attention_status",
    "corpus_windows",
    "cosine_homogenization",
    "default_ablation_modes",
    "attention_view",
    "compare_models",
    "homogenization_profile",
    "LengthStudy",
    "length_study",
    "load_corpus",
    "load_model",
    "massive_activation_hooks",
    "massive_activation_means",
    "massive_activations",
    "model_info",
    "over_checkpoints",
    "position_ablation_hooks",
    "position_ablation_study",
    "positional_patching",
    "positional_similarity",
    "resid_hook_name",
    "sink_analysis",
    "sink_attribution",
    "similarity_from_activations",
    "sink_scores",
    "to_token_batch",
]
