"""Remove or scramble positional information: hook specs and a context manager.

``position_ablation_hooks`` builds ``(hook_name, hook_fn)`` pairs from the architecture table
and the model's own positional machinery (its ``W_pos`` table or rotary function), ready for
``model.run_with_hooks(..., fwd_hooks=...)`` or ``model.hooks(...)``;
``ablated_positions`` attaches them through TransformerLens' level-scoped ``model.hooks()``,
which removes them on exit, normally or by an exception.

One meaning on every architecture and backend (checked against Hugging Face ``position_ids``):

* ``"zero"``: no positional signal. Learned absolute: the positional embedding is zero.
  Rotary: every token is rotated as position 0 (no rotation), so attention scores are the
  unrotated q.k / sqrt(d_head). ALiBi (BLOOM, MPT): the bias is removed.
* ``"permute"``: token i receives the positional signal of ``perm[i]`` (== ``position_ids=perm``;
  ALiBi: the bias recomputed from the permuted positions).
* ``"shift"``: token i receives the signal of i + shift (== ``position_ids=arange + shift``). A
  shift of every position changes nothing in a rotary or ALiBi model (scores depend only on
  i - j).

The families, their hook points and traps: the architecture table
(:mod:`homoglens.models.architectures`) and the supported-families page of the docs.
* ``"mean"`` (learned absolute only): every token receives the mean of the positional
  embeddings of the sequence's T positions.

NoPE still knows position: the causal mask lets a model count (Kazemnejad et al. 2023,
arXiv 2305.19466), so these ablations remove the *explicit* positional signal only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from homoglens.core.errors import InvalidInputError, UnsupportedArchitectureError
from homoglens.core.types import (
    MASSIVE_ABLATIONS,
    POSITION_ABLATIONS,
    RESIDUAL_SITES,
    FwdHooks,
    HookedModel,
    HookFn,
    MassiveAblation,
    PositionAblation,
    signature_of,
)
from homoglens.core.validate import (
    as_int,
    block_index,
    check_layers,
    chosen_indices,
    int_list,
    written_entry,
)
from homoglens.models.architectures import (
    ArchitectureSpec,
    architecture_of,
    component_hook_name,
    find_architecture,
    hf_architecture_of,
)
from homoglens.models.loading import is_hooked_transformer, model_lock
from homoglens.models.objects import refuse_in_context
from homoglens.models.positions import (
    alibi_slopes,
    bridge_prerotary,
    bridge_rotary,
    learned_table,
)
from homoglens.run.hooks import (
    PositionPlan,
    alibi_score_hook,
    learned_position_hook,
    rerotate_hook,
    rotary_table_hook,
    set_massive_hook,
)

__all__ = [
    "POSITION_ABLATIONS",
    "RESIDUAL_SITES",
    "ablated_massive_activations",
    "ablated_positions",
    "massive_activation_hooks",
    "massive_activation_sites",
    "position_ablation_hooks",
    "residual_write_hooks",
]


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
        else tuple(sorted(int_list("positions", positions, 0, n_ctx, window)))
    )
    perm_t = None
    if how == "permute":
        if perm is not None and seed is not None:
            raise InvalidInputError("give perm= or seed=, not both")
        if perm is None and seed is None:
            raise InvalidInputError("how='permute' needs perm= (a permutation) or seed= (random)")
        if perm is not None:
            perm_t = int_list("perm", perm, 0, n_ctx, window)
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
    return list(check_layers(layers, n_layers, blocks=True))


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

    Learned absolute models (GPT-2, GPT-Neo, OPT, GPT-BigCode) are changed at
    ``hook_pos_embed``. Rotary models (Llama, Mistral, Qwen, Gemma, OLMo 2, Phi, SmolLM3, ...;
    partial in GPT-NeoX / Pythia, Phi, StableLM; interleaved in GPT-J) are changed per block:
    on ``TransformerBridge`` the rotary tables ``blocks.{i}.attn.hook_cos/hook_sin`` are
    recomputed by the model's own rotary module at the new positions (Gemma 3: for the block's
    layer type); on ``HookedTransformer`` the rotated queries/keys at ``hook_rot_q/hook_rot_k``
    are rotated once more by (source - position) with the layer's own ``rotary_cos/sin`` tables
    (rotations compose). GPT-J's bridge fires neither: its queries/keys at
    ``blocks.{i}.attn.hook_q/hook_k`` are rotated by (source - position) with the Hugging Face
    rotary module's own sin/cos table just before that module rotates them by their position
    (R(p) R(source - p) = R(source)). ALiBi models (BLOOM, MPT) get ``slope_h * (s_j - j)``
    added at ``blocks.{i}.attn.hook_attn_scores``. All equal Hugging Face with the
    corresponding ``position_ids`` (ALiBi: the recomputed bias).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge`` of a supported architecture.
        how: ``"none"``, ``"zero"``, ``"permute"``, ``"shift"`` or ``"mean"`` (see module doc).
        positions: Only these positions (counted from the first token, each in
            ``[0, n_ctx)``) change; others keep their own signal. Positions beyond a sequence's
            length are ignored for that sequence.
        layers: Rotary and ALiBi models only: the blocks (0..n_layers-1; block l reads residual
            entry l, see "The layer axis" in the docs) whose rotation or
            bias changes; other blocks keep theirs.
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
            a shift outside ``n_ctx``, ``"mean"`` on a rotary or ALiBi model, ``layers`` on a
            learned one (each message names the family).
        UnsupportedArchitectureError: the architecture is not in the table (lists supported),
            or GPT-J on the bridge with a ``transformers`` whose GPT-J has no
            ``GPTJRotaryEmbedding`` module.

    References:
        Yusupov et al. 2025, arXiv 2508.17126 (positional bias and homogenization); Su et al.
        2021, RoFormer, arXiv 2104.09864 (rotary); Press et al. 2022, ALiBi, arXiv 2108.12409;
        Kazemnejad et al. 2023, arXiv 2305.19466.

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
    bridge = not is_hooked_transformer(model)
    if spec.positional == "learned_absolute":  # one table, at the embedding
        (name,) = spec.position_hook_names(0, bridge=bridge)
        return [(name, learned_position_hook(learned_table(model, spec), plan))]
    hooks: FwdHooks = []
    if spec.positional == "alibi":
        hook = alibi_score_hook(alibi_slopes(model, spec), plan)
        return [(name, hook) for i in blocks for name in spec.position_hook_names(i, bridge=bridge)]
    if not bridge:  # the rotated queries and keys, rotated once more
        for i in blocks:
            attn = model.blocks[i].attn
            hook = rerotate_hook(attn.rotary_cos, attn.rotary_sin, attn.rotate_every_two, plan)
            hooks += [(name, hook) for name in spec.position_hook_names(i, bridge=False)]
        return hooks
    if not spec.bridge_position_hooks:
        raise UnsupportedArchitectureError(
            f"positional ablations of {spec.family} need HookedTransformer: {spec.caveats}. "
            "Load the model with backend='hooked' (TransformerLens 3.9)"
        )
    if spec.bridge_prerotates:  # queries and keys rotated ahead of the HF module's rotation
        # R(p) R(s - p) = R(s): the module then rotates each token by its source position.
        hook = rerotate_hook(*bridge_prerotary(model, spec), plan)
        return [(name, hook) for i in blocks for name in spec.position_hook_names(i, bridge=True)]
    caches: dict[Any, Any] = {}
    for i in blocks:  # the rotary tables, recomputed at the new positions
        rotary = bridge_rotary(model, spec, i, caches)
        cos, sin = spec.position_hook_names(i, bridge=True)
        hooks.append((cos, rotary_table_hook(rotary, "cos", plan)))
        hooks.append((sin, rotary_table_hook(rotary, "sin", plan)))
    return hooks


@contextlib.contextmanager
@signature_of(position_ablation_hooks)
def ablated_positions(
    model: HookedModel, how: PositionAblation, **options: Any
) -> Iterator[HookedModel]:
    """Context manager: run ``model`` with positional information ablated, then restore it.

    The hooks of :func:`position_ablation_hooks` are attached with ``model.hooks()``
    (level-scoped: hooks you attached before stay) and removed on exit, also when the body
    raises. While the block runs, homoglens measurements of the model in other threads wait
    for it to end (they never read through these hooks); one in this thread, inside the block,
    records the hooks in ``provenance.foreign_hooks`` with a warning.

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
            before anything is attached; InvalidInputError for a ``transformers`` / nnsight
            model object (wrap it with ``load_model(obj)`` first).

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
    with hooks_attached(model, "ablated_positions", position_ablation_hooks, how, **options):
        yield model


@contextlib.contextmanager
def hooks_attached(
    model: HookedModel, what: str, make: Callable[..., FwdHooks], *args: Any, **options: Any
) -> Iterator[HookedModel]:
    """The block of a user-facing context manager (``what``, e.g. ``"ablated_positions"``):
    refuse a model object (:func:`homoglens.models.objects.refuse_in_context`), build the hooks
    with ``make(model, *args, **options)`` (its checks run before anything is attached), and
    keep them attached through ``model.hooks`` (removed however the block ends) while holding
    the model's lock, so that another thread's measurement waits for the block to end instead
    of reading through these hooks.

    Raises:
        InvalidInputError: a model object, or what ``make`` raises.
    """
    refuse_in_context(model, what)
    fwd_hooks = make(model, *args, **options)
    with model_lock(model).hold(), model.hooks(fwd_hooks=fwd_hooks):
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
        layer: The block, in ``[0, n_layers)`` (block l reads residual entry l).
        write: ``f(activation [batch pos d_model], hook) -> activation`` (the new stream).

    Returns:
        ``(hook_name, hook_fn)`` pairs, in the order they must run.

    Raises:
        InvalidInputError: unknown ``site``, a block out of range, or ``resid_mid`` on a model
            without one (GPT-NeoX runs attention and MLP in parallel).
    """
    if site not in RESIDUAL_SITES:
        raise InvalidInputError(f"site={site!r} must be one of {RESIDUAL_SITES}")
    layer = block_index("layer", layer, int(model.cfg.n_layers))
    name = component_hook_name(layer, site)
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

    return [(alias, into_mlp), (component_hook_name(layer, "resid_post"), out_of_block)]


def massive_activation_sites(
    model: HookedModel, *, layer: int, dims: Any, positions: Any = 0
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Check where massive activations are set: ``(layer, dims, positions)``, the index lists
    sorted; the arguments and errors of :func:`massive_activation_hooks`.

    Raises:
        InvalidInputError: ``layer`` outside [1, n_layers]; ``dims`` / ``positions`` empty,
            repeated, not integers, or outside [0, d_model) / [0, n_ctx).
    """
    n_layers = int(model.cfg.n_layers)
    layer = written_entry("layer", layer, n_layers)
    chosen_dims = chosen_indices("dims", dims, int(model.cfg.d_model), "the residual dimensions")
    chosen_pos = chosen_indices(
        "positions", positions, int(model.cfg.n_ctx), "the model's positions"
    )
    return layer, chosen_dims, chosen_pos


def massive_activation_hooks(
    model: HookedModel,
    how: MassiveAblation,
    *,
    layer: int,
    dims: Sequence[int] | int,
    positions: Sequence[int] | int = 0,
    means: torch.Tensor | None = None,
) -> FwdHooks:
    """Build forward hooks that set massive activations to zero or to their corpus mean.

    Sun et al. (2024) intervene on the output of one decoder layer (the layer where the massive
    activations appear), at the massive dimensions of the tokens that carry them, and measure the
    perplexity: ``set_zero`` destroys the model, ``set_mean`` leaves it intact. Here the output
    of decoder layer ``layer`` (1-indexed, as in their paper) is entry ``layer`` of the residual
    axis, TransformerLens' ``blocks.{layer-1}.hook_resid_post`` (the input of block ``layer``):
    at each position p of ``positions`` and dimension d of ``dims``, x[p, d] becomes 0
    (``how="zero"``) or ``means[i, j]`` (``how="mean"``), in every sequence; every other entry
    is unchanged. Positions are column indices of right-padded rows (0 = the first token, a BOS
    where the data has one). Massive activations sit on the first token (and, in some models,
    on the first delimiter), so ``positions`` defaults to 0; find the layer and dims with
    :func:`~homoglens.massive_activations` (``top_dims``) and the means with
    :func:`~homoglens.massive_activation_means` (see docs/sinks.md, "Interventions").

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        how: ``"zero"`` (``set_zero``) or ``"mean"`` (``set_mean``).
        layer: Residual entry in [1, n_layers] that is changed: the output of block
            ``layer - 1``, which block ``layer`` reads (Sun et al.'s 1-indexed decoder layer
            ``layer``; one layer base everywhere: "The layer axis" in the docs).
        dims: Residual dimensions to set (one int or a list; in [0, d_model), distinct).
        positions: Positions to set (one int or a list; in [0, n_ctx), distinct).
        means: For ``"mean"``: ``[len(positions) len(dims)]``, the value of each (position,
            dimension), rows and columns in sorted ``positions`` / ``dims`` order, in the
            model's units (as :func:`~homoglens.massive_activation_means` returns them).

    Returns:
        ``[(hook_name, hook_fn)]`` for ``model.hooks(fwd_hooks=...)`` or ``run_with_hooks``.

    Raises:
        InvalidInputError: unknown ``how``; bad ``layer`` / ``dims`` / ``positions``
            (:func:`massive_activation_sites`); ``"mean"`` without ``means``, ``means`` of the
            wrong shape or not finite, or ``means`` given with ``"zero"``.

    References:
        Sun et al. 2024, "Massive Activations in Large Language Models", arXiv 2402.17762
        (``main_llm.py --exp3`` and ``lib/hook.py`` of locuslab/massive-activations).

    Examples:
        >>> from homoglens import load_model, massive_activation_hooks
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("llama"), backend="bridge")
        >>> [name for name, _ in massive_activation_hooks(model, "zero", layer=1, dims=[3, 7])]
        ['blocks.0.hook_resid_post']
    """
    if not isinstance(how, str) or how not in MASSIVE_ABLATIONS:
        raise InvalidInputError(f"how={how!r} must be one of {list(MASSIVE_ABLATIONS)}")
    layer, chosen_dims, chosen_pos = massive_activation_sites(
        model, layer=layer, dims=dims, positions=positions
    )
    shape = (len(chosen_pos), len(chosen_dims))
    if how == "zero":
        if means is not None:
            raise InvalidInputError("means is only used with how='mean'; drop it for 'zero'")
        values = torch.zeros(shape, device="cpu")
    else:
        if means is None:
            raise InvalidInputError(
                "how='mean' needs means: pass means=massive_activation_means(model, data, "
                "layer=..., dims=..., positions=...) computed on a reference corpus"
            )
        if not isinstance(means, torch.Tensor) or not means.is_floating_point():
            raise InvalidInputError("means must be a float tensor [len(positions) len(dims)]")
        if tuple(means.shape) != shape:
            raise InvalidInputError(
                f"means has shape {tuple(means.shape)}, expected {shape} = (len(positions), "
                "len(dims)); compute it with the same positions and dims"
            )
        if not bool(torch.isfinite(means).all()):
            raise InvalidInputError("means holds NaN or inf; recompute it on a longer corpus")
        values = means.detach().clone()
    write = set_massive_hook(chosen_pos, chosen_dims, values)
    return residual_write_hooks(model, "resid_post", layer - 1, write)


@contextlib.contextmanager
@signature_of(massive_activation_hooks)
def ablated_massive_activations(
    model: HookedModel, how: MassiveAblation, **options: Any
) -> Iterator[HookedModel]:
    """Context manager: every forward pass inside runs with the massive activations set to zero
    or to their mean, then the model is restored (the hooks of
    :func:`massive_activation_hooks`, attached with ``model.hooks()``; removed on exit, also
    when the body raises).

    Args:
        model: A ``HookedTransformer`` or ``TransformerBridge``.
        how: ``"zero"`` or ``"mean"``.
        **options: ``layer``, ``dims``, ``positions``, ``means``, as for
            :func:`massive_activation_hooks`.

    Yields:
        The same model, with the hooks attached.

    Raises:
        InvalidInputError: as :func:`massive_activation_hooks`, before anything is attached; a
            ``transformers`` / nnsight model object (wrap it with ``load_model(obj)`` first).

    References:
        Sun et al. 2024, arXiv 2402.17762.

    Examples:
        >>> import torch
        >>> from homoglens import ablated_massive_activations, load_model
        >>> from homoglens.testing import tiny_model_folder
        >>> model = load_model(tiny_model_folder("gpt2"), backend="bridge")
        >>> with ablated_massive_activations(model, "zero", layer=1, dims=[7]):
        ...     logits = model(torch.tensor([[50256, 15496, 995]]))
        >>> tuple(logits.shape)
        (1, 3, 50257)
    """
    with hooks_attached(
        model, "ablated_massive_activations", massive_activation_hooks, how, **options
    ):
        yield model
