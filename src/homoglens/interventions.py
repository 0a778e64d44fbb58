"""Remove or scramble positional information: hook specs and a context manager.

``position_ablation_hooks`` builds ``(hook_name, hook_fn)`` pairs from the architecture table
and the model's own positional machinery (its ``W_pos`` table or rotary function), ready for
``model.run_with_hooks(..., fwd_hooks=...)`` or ``model.hooks(...)``;
``ablated_positions`` attaches them through TransformerLens' level-scoped ``model.hooks()``,
which removes them on exit, normally or by an exception.

One meaning on every architecture and backend (checked against Hugging Face ``position_ids``):

* ``"zero"``: no positional signal. Learned absolute: the positional embedding is zero.
  Rotary: every token is rotated as position 0 (no rotation), so attention scores are the
  unrotated q.k / sqrt(d_head).
* ``"permute"``: token i receives the positional signal of ``perm[i]`` (== ``position_ids=perm``).
* ``"shift"``: token i receives the signal of i + shift (== ``position_ids=arange + shift``). A
  shift of every position changes nothing in a rotary model (scores depend only on i - j).
* ``"mean"`` (learned absolute only): every token receives the mean of the positional
  embeddings of the sequence's T positions.

NoPE still knows position: the causal mask lets a model count (Kazemnejad et al. 2023,
arXiv 2305.19466), so these ablations remove the *explicit* positional signal only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from homoglens.architectures import (
    ArchitectureSpec,
    architecture_of,
    block_hook_name,
    find_architecture,
    hf_architecture_of,
)
from homoglens.errors import InvalidInputError, UnsupportedArchitectureError
from homoglens.hooks import (
    PositionPlan,
    alibi_score_hook,
    learned_position_hook,
    rerotate_hook,
    rotary_table_hook,
)
from homoglens.models import is_hooked_transformer
from homoglens.types import (
    POSITION_ABLATIONS,
    RESIDUAL_SITES,
    FwdHooks,
    HookedModel,
    HookFn,
    PositionAblation,
    signature_of,
)
from homoglens.validate import as_int

__all__ = [
    "POSITION_ABLATIONS",
    "RESIDUAL_SITES",
    "ablated_positions",
    "position_ablation_hooks",
    "residual_write_hooks",
]


def _int_list(name: str, values: Any, low: int, high: int, what: str) -> tuple[int, ...]:
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


def _plan(
    model: HookedModel,
    spec: ArchitectureSpec,
    how: PositionAblation,
    positions: Any,
    perm: Any,
    shift: Any,
    seed: Any,
) -> PositionPlan:
    if not isinstance(how, str) or how not in POSITION_ABLATIONS:
        raise InvalidInputError(f"how={how!r} must be one of {list(POSITION_ABLATIONS)}")
    if how == "mean" and spec.positional != "learned_absolute":
        kind = "rotary embeddings" if spec.positional == "rotary" else "an ALiBi attention bias"
        raise InvalidInputError(
            f"how='mean' needs a learned absolute positional table; {spec.family} models use "
            f"{kind} (there is no embedding to average). Use 'zero' or 'permute'."
        )
    n_ctx = int(model.cfg.n_ctx)
    window = "the context window"
    chosen = (
        None
        if positions is None
        else tuple(sorted(_int_list("positions", positions, 0, n_ctx, window)))
    )
    perm_t = None
    if how == "permute":
        if perm is not None and seed is not None:
            raise InvalidInputError("give perm= or seed=, not both")
        if perm is None and seed is None:
            raise InvalidInputError("how='permute' needs perm= (a permutation) or seed= (random)")
        if perm is not None:
            perm_t = _int_list("perm", perm, 0, n_ctx, window)
            if sorted(perm_t) != list(range(len(perm_t))):
                raise InvalidInputError(
                    f"perm must be a permutation of 0..{len(perm_t) - 1}; got {list(perm_t)[:8]}"
                )
        if seed is not None:
            seed = as_int("seed", seed, low=0, high=2**63 - 1)
    elif perm is not None or seed is not None:
        raise InvalidInputError(f"perm=/seed= only apply to how='permute', not {how!r}")
    if how == "shift":
        if shift is None:
            raise InvalidInputError("how='shift' needs an int shift=")
        shift = as_int("shift", shift, low=-(n_ctx - 1), high=n_ctx - 1)
        first = chosen if chosen is not None else (0,)  # position 0 exists in every sequence
        bad = [p for p in first if not 0 <= p + shift < n_ctx]
        if bad:
            raise InvalidInputError(
                f"shift={shift} moves position(s) {bad[:8]} outside the context window "
                f"[0, {n_ctx}); use a non-negative shift or restrict positions="
            )
    elif shift is not None:
        raise InvalidInputError(f"shift= only applies to how='shift', not {how!r}")
    return PositionPlan(
        how=how,
        n_ctx=n_ctx,
        positions=chosen,
        perm=perm_t,
        shift=shift,
        seed=seed,
    )


def _blocks(model: HookedModel, layers: Any, spec: ArchitectureSpec) -> list[int]:
    n_layers = int(model.cfg.n_layers)
    if layers is None:
        return list(range(n_layers))
    if spec.positional == "learned_absolute":
        raise InvalidInputError(
            "layers= restricts rotary or ALiBi changes to chosen blocks; in a learned-absolute "
            f"model ({spec.family}) position enters once, at hook_pos_embed. Use positions= "
            "instead."
        )
    if hasattr(layers, "__index__") and not isinstance(layers, bool):
        layers = [layers]
    return sorted(_int_list("layers", layers, 0, n_layers, "the block indices"))


def _hf_module(model: HookedModel, path: str) -> Any:
    module = model.original_model
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _bridge_rotary(
    model: HookedModel, spec: ArchitectureSpec, layer: int, caches: dict[Any, Any]
) -> Any:
    """The model's own rotary module as ``(source positions, device) -> (cos, sin)`` for block
    ``layer`` (Gemma 3: the module is asked for that layer's kind, local or global base).
    Blocks of one kind share a table cache in ``caches``."""
    module = _hf_module(model, spec.hf_position_module)
    dtype = next(model.parameters()).dtype
    extra: tuple[Any, ...] = ()
    if spec.rotary_per_layer is not None:
        extra = (getattr(model.original_model.config, spec.rotary_per_layer)[layer],)
    cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    cache = caches.setdefault(extra, {})

    def rotary(source: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # Every block and both tables of one forward ask for the same source positions (the
        # plan caches them per length), so compute the tables once per source and device.
        key = (id(source), str(device))
        hit = cache.get(key)
        if hit is not None and hit[0] is source:
            return hit[1], hit[2]
        dummy = torch.zeros(1, dtype=dtype, device=device)
        # Cached across passes: made outside inference mode so a pass with gradients can use it.
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = module(dummy, source.to(device)[None], *extra)
        if len(cache) > 64:
            cache.clear()
        cache[key] = (source, cos, sin)
        return cos, sin

    return rotary


def _alibi_slopes(model: HookedModel, spec: ArchitectureSpec) -> torch.Tensor:
    """Per-head ALiBi slopes ``[head_index]``, read from the model's own bias builder (BLOOM's
    ``build_alibi_tensor``, MPT's ``build_mpt_alibi_tensor``) as the bias step from key 0 to
    key 1, so they are the slopes the model uses (HookedTransformer: its own
    ``create_alibi_multipliers``)."""
    n_heads = int(model.cfg.n_heads)
    if is_hooked_transformer(model):
        from transformer_lens.components import (  # pyright: ignore[reportMissingImports]
            AbstractAttention,  # TransformerLens 3.9 only
        )

        return AbstractAttention.create_alibi_multipliers(n_heads, device="cpu").float()
    build = _hf_module(model, spec.hf_position_module)
    with torch.no_grad():
        if spec.family == "mpt":
            bias_max = model.original_model.config.attn_config.alibi_bias_max
            bias = build(n_heads, 2, bias_max).reshape(n_heads, 2)
        else:
            bias = build(torch.ones(1, 2), n_heads, torch.float32).reshape(n_heads, 2)
    return (bias[:, 1] - bias[:, 0]).float()


def _learned_table(model: HookedModel, spec: ArchitectureSpec) -> torch.Tensor:
    """The table as the model adds it: row p is position p (OPT's first ``position_offset``
    rows, which no token uses, are dropped; HookedTransformer drops them when it converts)."""
    if is_hooked_transformer(model):
        return model.W_pos.detach()
    table = _hf_module(model, spec.hf_position_module).weight.detach()
    return table[spec.position_offset :]


def position_ablation_hooks(
    model: HookedModel,
    how: PositionAblation,
    *,
    positions: Sequence[int] | torch.Tensor | None = None,
    layers: Sequence[int] | int | None = None,
    perm: Sequence[int] | torch.Tensor | None = None,
    shift: int | None = None,
    seed: int | None = None,
) -> FwdHooks:
    """Build forward hooks that zero, permute, shift or mean-ablate positional information.

    Learned absolute models (GPT-2) are changed at ``hook_pos_embed``. Rotary models (GPT-NeoX /
    Pythia, partial rotary; Llama, full rotary) are changed per block: on ``TransformerBridge``
    the rotary tables ``blocks.{i}.attn.hook_cos/hook_sin`` are recomputed by the model's own
    rotary module at the new positions; on ``HookedTransformer`` the rotated queries/keys at
    ``hook_rot_q/hook_rot_k`` are rotated once more by (source - position) with the layer's own
    ``rotary_cos/sin`` tables (rotations compose). Both equal Hugging Face with the
    corresponding ``position_ids``.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` of a supported architecture.
        how: ``"none"``, ``"zero"``, ``"permute"``, ``"shift"`` or ``"mean"`` (see module doc).
        positions: Only these positions (counted from the first token, each in
            ``[0, n_ctx)``) change; others keep their own signal. Positions beyond a sequence's
            length are ignored for that sequence.
        layers: Rotary models only: block indices (0..n_layers-1) whose rotation changes; other
            blocks keep theirs.
        perm: For ``"permute"``: a permutation of 0..T-1, T being the length you will run.
        shift: For ``"shift"``: offset k, token i gets the signal of i + k (must stay in
            ``[0, n_ctx)``).
        seed: For ``"permute"`` without ``perm``: draw the permutation for each length T from
            this seed (of the chosen ``positions`` among themselves, when given).

    Returns:
        ``[(hook_name, hook_fn), ...]`` (empty for ``"none"``). Hooks assume position i is the
        i-th column and the batch width is the sequence length: use unpadded batches of equal
        length, and no KV cache (a cached step's single column would be taken as position 0).

    Raises:
        InvalidInputError: bad mode, a ``perm`` with repeats or of the wrong length, positions or
            a shift outside ``n_ctx``, ``"mean"`` on a rotary model, ``layers`` on a learned one.
        UnsupportedArchitectureError: the architecture is not in the table (lists supported).

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (positional bias and homogenization); Su et al.
        2021, RoFormer, arXiv 2104.09864 (rotary); Kazemnejad et al. 2023, arXiv 2305.19466.

    Examples:
        >>> import torch
        >>> from homoglens import load_model, position_ablation_hooks
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> [name for name, _ in position_ablation_hooks(model, "zero")]
        ['hook_pos_embed']
    """
    if how == "none" and find_architecture(hf_architecture_of(model)) is None:
        return []  # nothing to change: no table row needed (residual patching, how="none")
    spec = architecture_of(model)
    plan = _plan(model, spec, how, positions, perm, shift, seed)
    blocks = _blocks(model, layers, spec)
    if how == "none":
        return []
    if spec.positional == "learned_absolute":
        return [("hook_pos_embed", learned_position_hook(_learned_table(model, spec), plan))]
    hooks: FwdHooks = []
    if spec.positional == "alibi":
        hook = alibi_score_hook(_alibi_slopes(model, spec), plan)
        return [(block_hook_name(i, "attn.hook_attn_scores"), hook) for i in blocks]
    if is_hooked_transformer(model):
        for i in blocks:
            attn = model.blocks[i].attn
            hook = rerotate_hook(attn.rotary_cos, attn.rotary_sin, attn.rotate_every_two, plan)
            hooks += [(block_hook_name(i, f"attn.hook_rot_{part}"), hook) for part in ("q", "k")]
        return hooks
    if not spec.bridge_position_hooks:
        raise UnsupportedArchitectureError(
            f"positional ablations of {spec.family} need HookedTransformer: {spec.caveats}. "
            "Load the model with backend='hooked' (TransformerLens 3.9)"
        )
    caches: dict[Any, Any] = {}
    for i in blocks:
        rotary = _bridge_rotary(model, spec, i, caches)
        hooks.append((block_hook_name(i, "attn.hook_cos"), rotary_table_hook(rotary, "cos", plan)))
        hooks.append((block_hook_name(i, "attn.hook_sin"), rotary_table_hook(rotary, "sin", plan)))
    return hooks


@contextlib.contextmanager
@signature_of(position_ablation_hooks)
def ablated_positions(
    model: HookedModel, how: PositionAblation, **options: Any
) -> Iterator[HookedModel]:
    """Context manager: run ``model`` with positional information ablated, then restore it.

    The hooks of :func:`position_ablation_hooks` are attached with ``model.hooks()``
    (level-scoped: hooks you attached before stay) and removed on exit, also when the body
    raises.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        how: ``"zero"``, ``"permute"``, ``"shift"`` or ``"mean"`` (see
            :func:`position_ablation_hooks` for what each means per architecture).
        **options: ``positions``, ``layers``, ``perm``, ``shift``, ``seed``, as for
            :func:`position_ablation_hooks` (restrict to positions or, on rotary models, to
            blocks; the permutation, offset or seed of ``"permute"`` / ``"shift"``).

    Yields:
        The same model, with the hooks attached.

    Raises:
        InvalidInputError, UnsupportedArchitectureError: as :func:`position_ablation_hooks`,
            before anything is attached.

    Examples:
        >>> import torch
        >>> from homoglens import ablated_positions, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("neox"), backend="bridge")
        >>> tokens = torch.tensor([[15496, 995, 11, 23748, 6116]])  # "Hello world, hello positions"
        >>> with ablated_positions(model, "permute", seed=0):
        ...     logits = model(tokens)
        >>> tuple(logits.shape)
        (1, 5, 50257)
    """
    fwd_hooks = position_ablation_hooks(model, how, **options)
    with model.hooks(fwd_hooks=fwd_hooks):
        yield model


def residual_write_hooks(model: HookedModel, site: str, layer: int, write: HookFn) -> FwdHooks:
    """Hooks that replace the residual stream itself at ``site`` of block ``layer``.

    The one place that decides what a residual-stream write means per backend. On
    ``HookedTransformer`` every ``hook_resid_*`` carries the stream, so ``write`` runs there.
    On ``TransformerBridge``, ``blocks.{l}.hook_resid_mid`` is the *input hook of ln2*: the
    block adds the MLP output to its own copy of the stream, so a write there changes only what
    the MLP reads (a restore of every position then reproduces the ``mlp_out`` effect, not 1).
    There ``write`` runs at the aliased hook (``ln2.hook_in``; ``mlp.hook_in`` on post-norm
    OLMo 2, whose MLP reads the stream unnormalised), so the MLP reads the written stream, and
    the change it made is added to ``blocks.{l}.hook_resid_post``: the stream that leaves the
    block is the written stream plus the MLP output of it, as on ``HookedTransformer``. Whether
    the mid hook is such an alias is read from the model (the hook point's own name), not
    assumed from its class.

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        site: One of :data:`RESIDUAL_SITES`.
        layer: Block index in ``[0, n_layers)``.
        write: ``f(activation [batch pos d_model], hook) -> activation`` (the new stream).

    Returns:
        ``(hook_name, hook_fn)`` pairs, in the order they must run.

    Raises:
        InvalidInputError: unknown ``site``, a block out of range, or ``resid_mid`` on a model
            without one (GPT-NeoX runs attention and MLP in parallel).
    """
    if site not in RESIDUAL_SITES:
        raise InvalidInputError(f"site={site!r} must be one of {RESIDUAL_SITES}")
    layer = as_int("layer", layer, low=0, high=int(model.cfg.n_layers) - 1)
    name = block_hook_name(layer, f"hook_{site}")
    if name not in model.hook_dict:
        raise InvalidInputError(
            f"{name} does not exist in this model (GPT-NeoX runs attention and MLP in "
            "parallel, so there is no residual stream between them); write resid_pre or "
            "resid_post instead"
        )
    # On the bridge, hook_resid_mid is an alias of the MLP's input hook (ln2.hook_in, or
    # mlp.hook_in on post-norm OLMo 2): its HookPoint carries the other name.
    alias = str(getattr(model.hook_dict[name], "name", name) or name)
    if site != "resid_mid" or alias == name:
        return [(name, write)]
    change: dict[str, torch.Tensor] = {}

    def into_mlp(activation: torch.Tensor, hook: Any) -> torch.Tensor:
        new = write(activation, hook)
        new = activation if new is None else new
        change["delta"] = new - activation
        return new

    def out_of_block(activation: torch.Tensor, hook: Any) -> torch.Tensor:
        return activation + change.pop("delta")

    return [(alias, into_mlp), (block_hook_name(layer, "hook_resid_post"), out_of_block)]
