"""Tiny offline models for tests, doctests and tutorials.

Each is a real Hugging Face checkpoint folder (``config.json`` + safetensors + the real GPT-2
BPE tokenizer) with seeded random weights, so it loads through exactly the same path as a
user's folder, on both TransformerLens backends, with no network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch

from homoglens.assets import atomic_folder, cache_dir, gpt2_tokenizer_folder

__all__ = ["TinyArch", "tiny_model_folder", "tiny_hf_config"]

TinyArch = Literal["gpt2", "neox", "llama"]

_GPT2_VOCAB = 50257
_BOS = 50256
_VERSION = 1  # bump when the recipe below changes, so cached folders are rebuilt


def tiny_hf_config(
    arch: TinyArch, *, n_layers: int = 2, d_model: int = 64, n_heads: int = 4, n_ctx: int = 128
) -> Any:
    """Return a small Hugging Face config of the given family (GPT-2 vocabulary).

    Args:
        arch: ``"gpt2"`` (learned absolute positions), ``"neox"`` (Pythia-style, partial rotary
            with ``rotary_pct=0.25``, parallel attention and MLP) or ``"llama"`` (full rotary,
            grouped-query attention, RMSNorm, tied embeddings).
        n_layers: Number of blocks.
        d_model: Residual width.
        n_heads: Attention heads (Llama uses ``n_heads // 2`` key-value heads).
        n_ctx: Context length (``n_positions`` / ``max_position_embeddings``).

    Returns:
        A ``GPT2Config``, ``GPTNeoXConfig`` or ``LlamaConfig``.

    Raises:
        ValueError: unknown ``arch``.
    """
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig

    common: dict[str, Any] = {"vocab_size": _GPT2_VOCAB, "bos_token_id": _BOS, "eos_token_id": _BOS}
    if arch == "gpt2":
        return GPT2Config(
            n_positions=n_ctx,
            **{"n_ctx": n_ctx},  # legacy names, taken by the config's **kwargs
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            **common,
        )
    if arch == "neox":
        return GPTNeoXConfig(
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=4 * d_model,
            **{"rotary_pct": 0.25},
            max_position_embeddings=n_ctx,
            use_parallel_residual=True,
            hidden_act="gelu",
            tie_word_embeddings=False,
            **common,
        )
    if arch == "llama":
        return LlamaConfig(
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=max(1, n_heads // 2),
            intermediate_size=2 * d_model,
            max_position_embeddings=n_ctx,
            tie_word_embeddings=True,
            **{"rope_theta": 10000.0},
            **common,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; use 'gpt2', 'neox' or 'llama'")


def tiny_model_folder(
    arch: TinyArch = "gpt2",
    *,
    seed: int = 0,
    tokenizer: bool = True,
    root: str | Path | None = None,
    **config: Any,
) -> Path:
    """Build (once) and return a tiny random-weight Hugging Face model folder.

    Args:
        arch: Model family, see :func:`tiny_hf_config`.
        seed: Seed of the random initialisation; the same seed gives the same weights.
        tokenizer: Save the real GPT-2 BPE tokenizer into the folder. Without it, a GPT-2
            folder still loads (homoglens supplies the vendored GPT-2 tokenizer).
        root: Where to put the folder; default ``cache_dir()/tiny``.
        **config: Overrides for :func:`tiny_hf_config` (``n_layers``, ``d_model``, ...).

    Returns:
        The folder path (``config.json``, ``model.safetensors``, tokenizer files).

    Examples:
        >>> from homoglens.testing import tiny_model_folder
        >>> sorted(p.name for p in tiny_model_folder("neox").glob("*.json"))[:1]
        ['config.json']
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = "-".join(
        [arch, f"s{seed}", "tok" if tokenizer else "notok", f"v{_VERSION}"]
        + [f"{k}{v}" for k, v in sorted(config.items())]
    )
    target = Path(root) if root is not None else cache_dir() / "tiny"
    target = target / key
    if (target / "config.json").exists():
        return target
    cfg = tiny_hf_config(arch, **config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg).eval()
    with atomic_folder(target) as tmp:
        model.save_pretrained(tmp)
        if tokenizer:
            AutoTokenizer.from_pretrained(str(gpt2_tokenizer_folder())).save_pretrained(tmp)
        (tmp / "homoglens_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed, **config}))
    return target
