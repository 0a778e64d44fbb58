"""Helpers shared by the tests (imported as ``from helpers import ...``; fixtures stay in
conftest.py): the backends under test, and the two checks every hook-attaching test makes."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from homoglens import ablated_positions
from homoglens.models.loading import has_hooked_transformer
from homoglens.testing import tiny_model_folder

BACKENDS = ["hooked", "bridge"] if has_hooked_transformer() else ["bridge"]
"""TransformerLens backends of the installed line: 3.9 has both, 4.x the bridge only."""

ARCHS = ["gpt2", "neox", "llama"]
"""Tiny offline architectures of :func:`homoglens.testing.tiny_model_folder`."""

AUSTEN_TEXTS = [
    "It is a truth universally acknowledged, that a single man in possession",
    "Emma Woodhouse, handsome, clever, and rich",
    "The family of Dashwood had long been settled in Sussex. Their estate was large, and "
    "their residence was at Norland Park",
    "No one who had ever seen Catherine Morland",
]
"""Openings of Austen novels, of unequal lengths (padding is exercised)."""

# Small text sets of the bad-input, saved-result and trap tests (unequal lengths on purpose).
TWO_OPENINGS = [
    "It is a truth universally acknowledged, that a single man",
    "Emma Woodhouse, handsome",
]

MIXED_LENGTHS = [
    "Hi there friend",
    "A dog ran far away from the house today and then it came back again.",
    "The cat sat.",
]

THREE_OPENINGS = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home",
    "The family of Dashwood had long been settled in Sussex.",
]

SHORT_TEXTS = [
    "Hello world, this is a short text about nothing at all.",
    "Another one, a bit longer.",
]

AUSTEN_OPENINGS = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "Emma Woodhouse, handsome",
]


def hook_count(model: Any) -> int:
    """Number of forward/backward hook functions attached to any hook point of the model."""
    total = 0
    for hp in model.hook_dict.values():
        total += len(hp._forward_hooks) + len(hp._forward_pre_hooks) + len(hp._backward_hooks)
    return total


def state_hash(model: Any) -> str:
    """SHA-256 of the model's state dict: equal before and after means the weights are intact."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()


# Oracle fixtures: one GPT-2-tokenised sentence, a fixed permutation of its positions, and
# the plain Hugging Face forward pass they are checked against.
TOKENS = torch.tensor([[50256, 15496, 995, 383, 2068, 7586, 21831, 11, 318, 257, 1332, 13]])
T = TOKENS.shape[1]
PERM = torch.randperm(T, generator=torch.Generator().manual_seed(7))


def hf_logits(arch: str, **kwargs) -> torch.Tensor:
    """Logits of the plain Hugging Face model of a tiny architecture on :data:`TOKENS` (eager
    attention); ``zero_wpe=True`` zeroes GPT-2's position table, other kwargs go to forward."""
    hf = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_folder(arch)), attn_implementation="eager"
    ).eval()
    zero_wpe = kwargs.pop("zero_wpe", False)
    if zero_wpe:
        hf.transformer.wpe.weight.data.zero_()
    with torch.no_grad():
        return hf(TOKENS, **kwargs).logits


def hf_written_logits(arch: str, tokens: torch.Tensor, layer: int, positions, dims, values):
    """The independent run of massive-activation interventions: plain Hugging Face forward on
    ``tokens`` with a torch forward hook on decoder layer ``layer`` (1-indexed) that writes
    ``values[i][j]`` at position ``positions[i]``, dimension ``dims[j]`` of its output hidden
    states, as Sun et al.'s ``lib/hook.py`` does (no homoglens or TransformerLens code);
    ``values=None``: no hook."""
    hf = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_folder(arch)), attn_implementation="eager"
    ).eval()
    blocks = hf.transformer.h if arch == "gpt2" else hf.model.layers

    def write(module, inputs, output):
        hidden = output[0] if isinstance(output, tuple) else output
        for i, p in enumerate(positions):
            for j, d in enumerate(dims):
                hidden[:, p, d] = values[i][j]
        return output

    handle = blocks[layer - 1].register_forward_hook(write) if values is not None else None
    try:
        with torch.no_grad():
            return hf(tokens).logits
    finally:
        if handle is not None:
            handle.remove()


HF_PARTS = {
    "gpt2": ("transformer.h", "attn", "c_proj"),
    "neox": ("gpt_neox.layers", "attention", "dense"),
    "llama": ("model.layers", "self_attn", "o_proj"),
}
"""Where the Hugging Face model of each tiny architecture keeps its decoder blocks, their
attention module, and its output projection (whose input is the heads' outputs ``z``
concatenated head by head, ``[batch pos n_heads * d_head]``)."""


@functools.cache
def hf_model(arch: str, dtype: torch.dtype = torch.float32) -> Any:
    """The plain Hugging Face model of a tiny architecture (eager attention), loaded once:
    never change it (copy it first)."""
    return AutoModelForCausalLM.from_pretrained(
        str(tiny_model_folder(arch)), attn_implementation="eager", dtype=dtype
    ).eval()


def hf_module(hf: Any, arch: str, layer: int, part: str) -> torch.nn.Module:
    """Decoder block ``layer`` (0-indexed) of ``hf`` (``part="block"``), its attention module
    (``"attn"``) or the attention's output projection (``"out_proj"``)."""
    blocks, attn, proj = HF_PARTS[arch]
    block = functools.reduce(getattr, blocks.split("."), hf)[layer]
    if part == "block":
        return block
    return getattr(block, attn) if part == "attn" else getattr(getattr(block, attn), proj)


def hf_run(hf: Any, tokens: torch.Tensor, edits=(), **kwargs) -> Any:
    """``hf(tokens, **kwargs)`` without gradients, with plain torch module hooks (no homoglens or
    TransformerLens code): ``edits`` are ``(module, "input" | "output", fn)``; ``fn`` maps the
    module's first input (the hidden states) or its first output to the tensor the pass uses
    instead (it may record it and return it unchanged)."""
    handles = []
    for module, where, fn in edits:
        if where == "input":

            def pre(mod, args, kw, fn=fn):
                if args:
                    return (fn(args[0]), *args[1:]), kw
                return args, {**kw, "hidden_states": fn(kw["hidden_states"])}

            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        else:

            def post(mod, args, output, fn=fn):
                if isinstance(output, tuple):
                    return (fn(output[0]), *output[1:])
                return fn(output)

            handles.append(module.register_forward_hook(post))
    try:
        with torch.no_grad():
            return hf(tokens, **kwargs)
    finally:
        for handle in handles:
            handle.remove()


def hf_resid_and_logits(
    hf: Any, arch: str, tokens: torch.Tensor, layer: int, edits=(), **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output of Hugging Face block ``layer - 1``, i.e. residual entry ``layer``; logits) of
    :func:`hf_run`."""
    seen = {}

    def keep(x: torch.Tensor) -> torch.Tensor:
        seen["resid"] = x.clone()
        return x

    block = hf_module(hf, arch, layer - 1, "block")
    out = hf_run(hf, tokens, [*edits, (block, "output", keep)], **kwargs)
    return seen["resid"], out.logits


def run_ablated(model, how=None, **kwargs) -> torch.Tensor:
    """``model(TOKENS)``, inside ``ablated_positions(model, how, **kwargs)`` unless ``how`` is
    None."""
    with torch.no_grad():
        if how is None:
            return model(TOKENS)
        with ablated_positions(model, how, **kwargs):
            return model(TOKENS)


def cosine_oracle(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """to_others [pos] and mean_pairwise from plain float64 cosines, no homoglens code."""
    rows, pairwise = [], []
    n_pos = int(mask.sum(1).max())
    sums, counts = torch.zeros(n_pos, dtype=torch.float64), torch.zeros(n_pos)
    for b in range(hidden.shape[0]):
        x = hidden[b][mask[b].bool()].double()
        t = x.shape[0]
        cos = torch.nn.functional.cosine_similarity(x[:, None], x[None], dim=-1)
        off = cos.sum(1) - cos.diagonal()
        sums[:t] += off / (t - 1)
        counts[:t] += 1
        pairwise.append(off.sum() / (t * (t - 1)))
        rows.append(x)
    return sums / counts, torch.stack(pairwise).mean()


def outside_the_table(folder: Any) -> str:
    """Save a tiny decoder-only model of a family TransformerLens loads but homoglens' table
    lacks (IBM Granite, seed 0, the GPT-2 tokenizer) into ``folder``; return its path."""
    from pathlib import Path

    from transformers import AutoTokenizer, GraniteConfig

    from homoglens.models.assets import gpt2_tokenizer_folder

    folder = Path(folder)
    if (folder / "config.json").exists():
        return str(folder)
    config = GraniteConfig(
        vocab_size=50257,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        bos_token_id=50256,
        eos_token_id=50256,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(gpt2_tokenizer_folder())).save_pretrained(folder)
    return str(folder)


@contextlib.contextmanager
def eager_attention():
    """Every pass inside runs eager attention (no SDPA fast path): for tests that compare a
    pattern-reading pass (always eager) with a residual-only one bit for bit."""
    import homoglens.run.fast_attention as fa

    saved, fa.ENABLED = fa.ENABLED, False
    try:
        yield
    finally:
        fa.ENABLED = saved


def public_measurements(tokens: torch.Tensor) -> dict[str, Any]:
    """Every public measurement that runs a model, as ``name -> f(model)`` on ``tokens``
    (``[batch pos]`` windows of equal length, at least 24 tokens): the device-discipline test
    and the ``cuda`` suite run each of them."""
    import homoglens as hg

    texts_like = tokens  # token ids are data for every measurement

    def massive_means(m: Any) -> Any:
        return hg.massive_activation_means(m, texts_like, layer=1, dims=[0], progress=False)

    def massive_study(m: Any) -> Any:
        return hg.massive_ablation_study(
            m, texts_like, layer=1, dims=[0, 1], positions=[0], progress=False
        )

    def on(m: Any) -> torch.Tensor:  # the user's own forward: tokens where the model is
        return tokens[:1].to(next(m.parameters()).device)

    def ablated(m: Any) -> Any:
        with torch.inference_mode(), hg.ablated_positions(m, "permute", seed=0):
            return m(on(m))

    def biased(m: Any) -> Any:
        with torch.inference_mode(), hg.biased_attention(m, "first", 1.0):
            return m(on(m))

    def massive_forward(m: Any) -> Any:
        with torch.inference_mode(), hg.ablated_massive_activations(m, "zero", layer=1, dims=[0]):
            return m(on(m))

    quiet = {"progress": False}
    return {
        "homogenization_profile": lambda m: hg.homogenization_profile(
            m, tokens, effective_rank=True, **quiet
        ),
        "positional_similarity": lambda m: hg.positional_similarity(
            m, tokens, edge_k=2, centre="position", pseudo_values=True, **quiet
        ),
        "position_ablation_study": lambda m: hg.position_ablation_study(m, tokens, **quiet),
        "sink_scores": lambda m: hg.sink_scores(m, tokens, **quiet),
        "sink_analysis": lambda m: hg.sink_analysis(m, tokens, top_k=1, edge_k=2, **quiet),
        "attention_view": lambda m: hg.attention_view(m, "Hello there, world", [(1, 0)]),
        "attention_received": lambda m: hg.attention_received(m, tokens, **quiet),
        "attention_rollout": lambda m: hg.attention_rollout(m, tokens, **quiet),
        "perturbation_spread": lambda m: hg.perturbation_spread(m, tokens, position=2, **quiet),
        "sink_attribution exact": lambda m: hg.sink_attribution(
            m, tokens, top_k=1, edge_k=2, **quiet
        ),
        "sink_attribution fast": lambda m: hg.sink_attribution(
            m, tokens, method="fast", edge_k=2, **quiet
        ),
        "sink_attribution mean": lambda m: hg.sink_attribution(
            m, tokens, ablation="mean", top_k=1, edge_k=2, **quiet
        ),
        "massive_activations": lambda m: hg.massive_activations(m, tokens, **quiet),
        "find_massive_sites": lambda m: hg.find_massive_sites(m, tokens, **quiet),
        "massive_activation_means": massive_means,
        "massive_ablation_study": massive_study,
        "compression_valleys": lambda m: hg.compression_valleys(
            m, tokens, ablation_layer=1, dims=[0, 1], n_boot=100, **quiet
        ),
        "attention_bias_study": lambda m: hg.attention_bias_study(
            m, tokens, kind="first", strengths=[-1.0, 0.0, 1.0], edge_k=2, **quiet
        ),
        "attention_bias_study gradient": lambda m: hg.attention_bias_study(
            m,
            tokens,
            kind="recent",
            strengths=[-0.5, 0.0, 0.5],
            layers=[1],
            edge_k=2,
            gradient_windows=2,
            **quiet,
        ),
        "length_study": lambda m: hg.length_study(
            m, tokens, lengths=[int(tokens.shape[1]) // 2, int(tokens.shape[1])], edge_k=2, **quiet
        ),
        "positional_patching": lambda m: hg.positional_patching(m, tokens, bins=2, **quiet),
        "positional_patching head": lambda m: hg.positional_patching(
            m, tokens, component="head", **quiet
        ),
        "compare_models": lambda m: hg.compare_models(
            {"m": m}, hg.to_token_batch(m, tokens), edge_k=2, n_boot=50, progress=False
        ),
        "ablated_positions": ablated,
        "biased_attention": biased,
        "ablated_massive_activations": massive_forward,
    }


@contextlib.contextmanager
def factories_on_meta():
    """Inside: every tensor factory (``torch.zeros``, ``arange``, ``tensor``, ...) called from
    homoglens' own code without a ``device=`` makes its tensor on the ``meta`` device. A
    measurement that runs inside on a CPU model then fails wherever homoglens made a tensor
    without naming its device (a tensor meant for the model's device meets a CPU activation; a
    result tensor meant for the CPU has no data): the CPU-only test that catches what a CUDA
    model would (``Expected all tensors to be on the same device``)."""
    import sys
    from pathlib import Path

    from torch.overrides import TorchFunctionMode

    import homoglens

    root = str(Path(homoglens.__file__).parent)
    factories = {
        torch.zeros,
        torch.ones,
        torch.empty,
        torch.full,
        torch.arange,
        torch.tensor,
        torch.randint,
        torch.rand,
        torch.randn,
        torch.randperm,
        torch.eye,
        torch.linspace,
    }

    class MetaFactories(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in factories and kwargs.get("device") is None:
                caller = sys._getframe(1).f_code.co_filename
                if caller.startswith(root):
                    kwargs["device"] = "meta"
            return func(*args, **kwargs)

    with MetaFactories():
        yield


def reseal(folder: Any) -> None:
    """Record again the sha256 of a saved result's files after a test edited them, as a save
    would have (deepest JSON first, so a composite's JSON records its parts' new JSON): the
    value checks of ``load`` must refuse an edit on their own, hashes or no hashes."""
    import json
    from pathlib import Path

    from homoglens.results.storage import HASHES, sha256_of, write_json

    paths = sorted(Path(folder).rglob("*.json"), key=lambda p: -len(p.parts))
    for path in paths:
        meta = json.loads(path.read_text())
        if not isinstance(meta, dict) or not isinstance(meta.get(HASHES), dict):
            continue
        hashes = {
            name: sha256_of((path.parent / name).read_bytes())
            for name in meta[HASHES]
            if name != path.name and (path.parent / name).is_file()
        }
        write_json(path, {**meta, HASHES: hashes})
