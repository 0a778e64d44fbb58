"""Small argument checks shared by the public functions (typed errors with clear messages)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, cast

import torch

from homoglens.core.errors import (
    InvalidInputError,
    ModelStateError,
    NonFiniteActivationError,
    warn_user,
)

__all__ = ["as_bool", "as_float", "as_int", "require_finite"]


def as_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as a Python int (numpy/torch integers accepted), within [low, high]."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidInputError(f"{name}={value!r} must be an integer")
    try:  # a float or multi-element tensor/array has __index__ but refuses it
        number = operator.index(value)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidInputError(f"{name}={value!r} must be a single integer") from None
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise InvalidInputError(f"{name}={number} must lie in {bounds}")
    return number


def as_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool (numpy bools accepted); refuse strings and numbers."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if (
        hasattr(value, "dtype")
        and getattr(value, "shape", None) == ()
        and "bool" in str(value.dtype)
    ):
        return bool(value)  # a 0-d bool tensor or array
    raise InvalidInputError(f"{name}={value!r} must be True or False")


def _is_complex(value: Any) -> bool:
    """A torch tensor of complex dtype (numpy values show it in ``dtype.kind``)."""
    check = getattr(value, "is_complex", None)
    return bool(check()) if callable(check) else False


def as_float(name: str, value: Any, *, low: float, high: float) -> float:
    """Return ``value`` as a float strictly inside (low, high)."""
    complex_dtype = getattr(getattr(value, "dtype", None), "kind", "") == "c"
    if isinstance(value, (bool, str, bytes, complex)) or complex_dtype or _is_complex(value):
        raise InvalidInputError(f"{name}={value!r} must be a real number")
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise InvalidInputError(f"{name}={value!r} must be a number") from err
    if not low < number < high:  # also refuses NaN
        raise InvalidInputError(f"{name}={number} must lie in ({low}, {high})")
    return number


def require_finite(values: Any, where: str, what: str = "activations") -> None:
    """The one non-finite check of every measurement: raise before anything is averaged in.

    Args:
        values: The tensor a result is computed from (already restricted to real tokens).
        where: The hook or quantity, for the message.
        what: What the values are.

    Raises:
        NonFiniteActivationError: ``values`` holds NaN or inf.
    """
    import torch

    finite = torch.isfinite(values)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise NonFiniteActivationError(
            f"{where}: {bad} of {finite.numel()} {what} are NaN or inf; nothing was averaged in. "
            "Check the model's weights and dtype (float16 overflows; try float32 or bfloat16)"
        )


def check_layers(layers: Any, n_layers: int, *, blocks: bool = False) -> tuple[int, ...]:
    """``layers`` as sorted distinct entries of the residual axis ``0..n_layers`` (``None``:
    all), or with ``blocks=True`` as block indices ``0..n_layers - 1``.

    Raises:
        InvalidInputError: not ints, empty, repeated, or out of range (the message gives the
            range and what its entries mean).
    """
    if layers is None:
        return tuple(range(n_layers if blocks else n_layers + 1))
    if type(layers).__module__ == "numpy" and getattr(layers, "ndim", 0) >= 1:
        layers = torch.as_tensor(layers)
    if isinstance(layers, torch.Tensor):
        if layers.is_floating_point() or layers.is_complex() or layers.ndim > 1:
            raise InvalidInputError(
                f"layers must be ints, got a {layers.dtype} tensor of shape {tuple(layers.shape)}"
            )
        layers = layers.reshape(-1).tolist()
    elif hasattr(layers, "__index__") and not isinstance(layers, bool):
        layers = [layers]
    try:
        chosen = list(cast(Any, layers))
    except TypeError as err:
        raise InvalidInputError(f"layers={layers!r} must be a list of ints") from err
    if not chosen:
        top = n_layers - 1 if blocks else n_layers
        raise InvalidInputError(f"layers is empty; give layers in 0..{top} or None for all")
    not_int = [
        layer for layer in chosen if isinstance(layer, bool) or not hasattr(layer, "__index__")
    ]
    if not_int:
        raise InvalidInputError(f"layers must hold ints, got {not_int[:5]}")
    chosen = [operator.index(layer) for layer in chosen]  # numpy and torch integers too
    if blocks:
        bad = [layer for layer in chosen if not 0 <= layer < n_layers]
        if bad:
            raise InvalidInputError(not_blocks("layers", bad, n_layers))
    bad = [layer for layer in chosen if not 0 <= layer <= n_layers]
    if bad:
        raise InvalidInputError(
            f"layers {bad} are out of range: entries of the residual axis are 0..{n_layers} "
            f"(0 = embeddings, l = output of block l-1; this model has {n_layers} blocks)"
        )
    if len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"layers={chosen} has repeats")
    return tuple(sorted(chosen))


LAYER_AXIS = "one layer base everywhere: see 'The layer axis' in the docs"
"""Where every layer-kind message points: homoglens counts layers on one axis (docs/index.md)."""


def not_blocks(name: str, bad: Sequence[int], n_layers: int) -> str:
    """The message of a block index out of range, in terms of the one layer axis."""
    return (
        f"{name} {list(bad)[:8]} are not blocks of this model: block l is the one "
        f"that reads residual entry l, numbered 0..{n_layers - 1} here ({n_layers} blocks); entry "
        f"{n_layers} is the output of the last block, which no block reads ({LAYER_AXIS})"
    )


def block_index(name: str, value: Any, n_layers: int) -> int:
    """One block index ``0..n_layers - 1``: the block that reads residual entry ``value``.

    Raises:
        InvalidInputError: not an integer, or out of range (the message explains the axis).
    """
    number = as_int(name, value)
    if not 0 <= number < n_layers:
        raise InvalidInputError(not_blocks(name, [number], n_layers))
    return number


def written_entry(name: str, value: Any, n_layers: int) -> int:
    """One residual entry that a block writes, ``1..n_layers`` (entry l is the output of block
    l - 1, the stream block l reads): where a massive activation is set or read.

    Raises:
        InvalidInputError: not an integer, 0 (the embeddings, which no block writes) or above
            ``n_layers`` (the message explains the axis).
    """
    number = as_int(name, value)
    if not 1 <= number <= n_layers:
        why = (
            "entry 0 is the embeddings, which no block writes"
            if number == 0
            else f"this model has {n_layers} blocks"
        )
        raise InvalidInputError(
            f"{name}={number} is not a block's output: entries 1..{n_layers} are (entry l is the "
            f"output of block l - 1, which block l reads); {why} ({LAYER_AXIS})"
        )
    return number


def int_list(name: str, values: Any, low: int, high: int, what: str) -> tuple[int, ...]:
    """Validate a list / 1-d integer tensor / numpy array of distinct ints in [low, high)."""
    if isinstance(values, torch.Tensor):
        if values.is_floating_point() or values.is_complex() or values.ndim != 1:
            raise InvalidInputError(f"{name} must be a 1-d integer tensor or a list of ints")
        values = values.tolist()
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # numpy arrays
    if isinstance(values, (str, bytes)):
        raise InvalidInputError(f"{name}={values!r} must be a list of ints")
    try:
        out = tuple(as_int(name, v) for v in values)
    except TypeError as err:
        raise InvalidInputError(f"{name}={values!r} must be a list of ints") from err
    if not out:
        raise InvalidInputError(f"{name} is empty")
    bad = [v for v in out if not low <= v < high]
    if bad:
        raise InvalidInputError(f"{name} {bad[:8]} lie outside {what} [{low}, {high})")
    if len(set(out)) != len(out):
        repeats = sorted({v for v in out if out.count(v) > 1})
        raise InvalidInputError(f"{name} has repeated entries {repeats[:8]}")
    return out


def chosen_indices(name: str, values: Any, high: int, what: str) -> tuple[int, ...]:
    """Sorted distinct indices in [0, high): one int (a Python or numpy integer, a 0-d tensor)
    or a list / 1-d tensor / 1-d array of them; ``None``: all.

    Args:
        name: The argument's name, for the error message.
        values: The indices given.
        high: Every index must lie below it.
        what: What the indices count, for the error message.

    Returns:
        The indices, sorted.

    Raises:
        InvalidInputError: no index, one that is not an integer, out of range or repeated.
    """
    if values is None:
        return tuple(range(high))
    scalar = getattr(values, "ndim", None) == 0 or (
        isinstance(values, int) and not isinstance(values, bool)
    )
    return tuple(sorted(int_list(name, [values] if scalar else values, 0, high, what)))


def at_most(name: str, value: int, most: int, what: str) -> int:
    """``value`` if it is at most ``most``, else ``most`` with a warning that says so (a value
    larger than what there is to take is cut, never silently). ``what`` names ``most``."""
    if value <= most:
        return value
    warn_user(f"homoglens: {name}={value} is more than the {most} {what}; using {most}")
    return most


def positive_int(name: str, value: Any) -> int:
    return as_int(name, value, low=1)


def check_attention_mask(tokens: torch.Tensor, attention_mask: Any) -> torch.Tensor:
    if attention_mask is None:
        return torch.ones_like(tokens)
    if not isinstance(attention_mask, torch.Tensor):
        raise InvalidInputError(
            f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}"
        )
    if attention_mask.ndim == 1 and tokens.shape[0] == 1:
        attention_mask = attention_mask.unsqueeze(0)
    if tuple(attention_mask.shape) != tuple(tokens.shape):
        raise InvalidInputError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but tokens have shape "
            f"{tuple(tokens.shape)}; give one 0/1 entry per token ([batch pos])"
        )
    if attention_mask.is_complex():
        raise InvalidInputError("attention_mask must hold real 0/1 values, not complex numbers")
    if attention_mask.is_floating_point():
        if not torch.isin(
            attention_mask,
            torch.tensor([0.0, 1.0], dtype=attention_mask.dtype, device=attention_mask.device),
        ).all():
            raise InvalidInputError("attention_mask must hold only 0 and 1")
    mask = attention_mask.to(torch.long).cpu()
    if not ((mask == 0) | (mask == 1)).all():
        raise InvalidInputError("attention_mask must hold only 0 and 1 (1 = real token, 0 = pad)")
    lengths = mask.sum(1)
    if (lengths == 0).any():
        rows = torch.nonzero(lengths == 0).flatten().tolist()
        raise InvalidInputError(f"sequences {rows} are all padding; drop them")
    starts = mask.argmax(dim=1)
    pos = torch.arange(mask.shape[1], device=mask.device)
    contiguous = ((pos >= starts[:, None]) & (pos < (starts + lengths)[:, None])).long()
    if not torch.equal(contiguous, mask):
        rows = torch.nonzero((contiguous != mask).any(1)).flatten().tolist()
        raise InvalidInputError(
            f"attention_mask rows {rows} have pads between real tokens; homoglens needs each "
            "sequence's real tokens in one block (left or right padding)"
        )
    return mask


def check_device(device: str | torch.device | None) -> str:
    """Resolve and validate a torch device; default CUDA when available, else CPU."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InvalidInputError(f"device={device!r} is not a torch device ({err})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(
            f"device={device!r} but this torch build or machine has no CUDA; use device='cpu'"
        )
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise InvalidInputError(f"device={device!r} is not supported; use 'cpu' or 'cuda'")
    return str(dev)


def check_key_eps(key: Any, eps: Any, n_ctx: int) -> tuple[int, float]:
    key = as_int("key", key, low=0, high=n_ctx - 1)
    try:
        eps = as_float("eps", eps, low=0.0, high=1.0)
    except InvalidInputError as err:
        raise InvalidInputError(f"{err}; Gu et al. use eps=0.3") from None
    return key, eps


def check_heads(heads: Any, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """Validate ``(layer, head)`` pairs with ``layer < n_layers``."""
    if hasattr(heads, "columns") and {"layer", "head"} <= set(heads.columns):  # a DataFrame
        heads = list(zip(heads["layer"], heads["head"], strict=True))
    elif hasattr(heads, "tolist") and not isinstance(heads, (str, bytes)):  # numpy / torch [k 2]
        heads = heads.tolist()
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise InvalidInputError(f"heads={heads!r} must be a list of (layer, head) pairs")
    chosen = []
    for pair in heads:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidInputError(f"heads must be (layer, head) pairs, got {pair!r}")
        lay = as_int("head layer", pair[0], low=0)
        if lay >= n_layers:
            raise InvalidInputError(
                f"head ({pair[0]}, {pair[1]}): layer {lay} must be below {n_layers} (heads must "
                "exist and, for sink_attribution, come before the measured residual entry)"
            )
        chosen.append((lay, as_int("head index", pair[1], low=0, high=n_heads - 1)))
    if not chosen or len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"heads={heads!r} must be non-empty and without repeats")
    return chosen


def check_model(model: Any) -> None:
    """Refuse anything that is not a loaded TransformerLens model (a name, None, a module).

    Model objects (``transformers`` / nnsight) are wrapped before this check, by
    :func:`homoglens.run.entrance.entrance` at the top of each public measurement.

    Raises:
        InvalidInputError: ``model`` has no ``cfg``/``hook_dict`` or cannot run hooks.
        ModelStateError: weights on the ``meta`` device (they hold no values).
    """
    if isinstance(model, (str, bytes)) or not (
        hasattr(model, "cfg") and hasattr(model, "hook_dict") and hasattr(model, "run_with_hooks")
    ):
        raise InvalidInputError(
            f"expected a HookedTransformer or TransformerBridge, got {type(model).__name__}"
            + (f" {model!r}" if isinstance(model, str) else "")
            + "; load one first with homoglens.load_model(name), or pass a transformers "
            "PreTrainedModel of a decoder-only causal LM or an nnsight LanguageModel (wrapped "
            "without copying its weights)"
        )
    parameters = getattr(model, "parameters", None)
    found = parameters() if callable(parameters) else ()
    meta = [p for p in cast(Any, found) if getattr(p, "is_meta", False)]
    if meta:
        raise ModelStateError(
            f"{len(meta)} weight(s) of the model are on the 'meta' device, which holds shapes "
            "but no values (a model built under init_empty_weights / device='meta', or moved "
            "with .to('meta')): nothing can be measured. Load real weights, e.g. "
            "homoglens.load_model(name, device='cpu')"
        )


def first_few(names: Sequence[str], limit: int) -> str:
    """``names`` joined by commas, cut after ``limit`` with how many more there are (for
    error messages)."""
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")
