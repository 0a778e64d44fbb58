"""The one entrance of every measurement: :func:`entrance` is called once per public call with
the user's model and the options every measurement shares (``batch_size``, ``progress``), and
the :class:`Entrance` it returns carries them through the measurement.

It wraps any model input (a TransformerLens model, a ``transformers`` or an nnsight object,
:func:`~homoglens.models.objects.as_hooked`), checks the shared options once, builds the token
batch (:meth:`Entrance.batch`), resolves the BOS (:meth:`Entrance.bos_id`), reads the model's
state once (:attr:`Entrance.info`) and runs every pass of the call (:meth:`Entrance.stream`),
which knows which windows each rank holds (:meth:`Entrance.shard`). A measurement never calls
``as_hooked`` itself nor re-derives its shard; its public signature stays flat keyword
arguments with full docstrings (notebook completion), forwarded here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from homoglens.core.validate import as_bool, check_model, positive_int
from homoglens.models.objects import as_hooked
from homoglens.models.state import model_info
from homoglens.run.data import to_token_batch
from homoglens.run.data.batch import tokenizer_bos
from homoglens.run.engine import model_device, rank_windows, stream

if TYPE_CHECKING:
    import torch

    from homoglens.core.types import BosPolicy, HookedModel, ModelInput
    from homoglens.models.state import ModelInfo
    from homoglens.run.data import DataInput, TokenBatch
    from homoglens.run.engine import Reducer


@dataclass(frozen=True)
class Entrance:
    """One measurement call: the model, wrapped, and the shared options, checked.

    Attributes:
        model: The model as TransformerLens runs it (a model object wrapped, not copied).
        batch_size: Sequences per forward pass, >= 1.
        progress: Show a progress bar per pass.
    """

    model: HookedModel
    batch_size: int
    progress: bool
    _info: list[ModelInfo] = field(default_factory=list, repr=False, compare=False)

    @property
    def info(self) -> ModelInfo:
        """The model's state at call time (name, backend, dtype, weights, foreign hooks), read
        once per call, when first asked for (:func:`~homoglens.models.state.model_info`). Not a
        ``functools.cached_property``: before Python 3.12 its lock is shared by every instance,
        so a call waiting here for the model's lock would block another thread's call that holds
        it (an intervention's ``with`` block)."""
        if not self._info:
            self._info.append(model_info(self.model))
        return self._info[0]

    @property
    def device(self) -> torch.device:
        """The model's device, after the check of its state (no submodule in training mode).

        Raises:
            ModelStateError: a submodule is in training mode.
        """
        return model_device(self.model)

    def batch(
        self,
        data: DataInput,
        *,
        attention_mask: Any = None,
        bos: BosPolicy | bool = "auto",
        text_column: str = "text",
        n_seq: int | None = None,
    ) -> TokenBatch:
        """The token batch of ``data`` (:func:`~homoglens.run.data.to_token_batch`, whose
        docstring lists the inputs taken and the errors raised)."""
        return to_token_batch(
            self.model,
            data,
            attention_mask=attention_mask,
            bos=bos,
            text_column=text_column,
            n_seq=n_seq,
        )

    @property
    def bos_id(self) -> int | None:
        """The tokenizer's BOS id, or None (no tokenizer, or one without a BOS)."""
        return tokenizer_bos(self.model)

    def shard(self, n: int) -> tuple[int, int]:
        """``(start, stop)``: the windows of ``n`` this rank runs (all of them without a
        process group), as :meth:`stream` shards them."""
        return rank_windows(n)

    def stream(self, batch: TokenBatch, reducers: Sequence[Reducer], **options: Any) -> Any:
        """Run ``batch`` through the model into ``reducers`` with this call's batch size and
        progress bar (:func:`~homoglens.run.engine.stream`, whose keyword ``options`` (``desc``,
        ``passes``, ``extra_hooks``, ...) pass through). Returns the model's device."""
        return stream(
            self.model,
            batch,
            reducers,
            batch_size=self.batch_size,
            progress=self.progress,
            **options,
        )


def entrance(model: ModelInput, *, batch_size: Any = 8, progress: Any = True) -> Entrance:
    """The :class:`Entrance` of one measurement call: ``model`` wrapped for TransformerLens and
    the shared options checked, before anything else of the call runs.

    Args:
        model: What a public measurement's ``model`` takes: a ``HookedTransformer`` or
            ``TransformerBridge``, a ``transformers`` causal LM, or an nnsight ``LanguageModel``.
        batch_size: Sequences per forward pass, an integer >= 1.
        progress: Show a progress bar, a bool.

    Raises:
        InvalidInputError: not a model (a name, None, a module), a ``batch_size`` below 1 or
            not an integer, or a ``progress`` that is not a bool.
        ModelStateError: the model's weights are on the ``meta`` device.
    """
    hooked = as_hooked(model)  # a transformers / nnsight model object is wrapped, not copied
    check_model(hooked)
    return Entrance(hooked, positive_int("batch_size", batch_size), as_bool("progress", progress))
