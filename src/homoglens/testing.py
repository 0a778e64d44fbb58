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

from homoglens.models.assets import atomic_folder, cache_dir, gpt2_tokenizer_folder

__all__ = ["TINY_ARCHS", "TinyArch", "tiny_hf_config", "tiny_model_folder"]

TinyArch = Literal[
    "gpt2",
    "neox",
    "llama",
    "gptneo",
    "opt",
    "gpt_bigcode",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "olmo2",
    "phi3",
    "smollm3",
    "phi",
    "stablelm",
    "gptj",
    "bloom",
    "mpt",
]
"""Families :func:`tiny_model_folder` builds: one per row of the architecture table."""

TINY_ARCHS: tuple[str, ...] = TinyArch.__args__  # type: ignore[attr-defined]
"""Every :data:`TinyArch`, in table order."""

_GPT2_VOCAB = 50257
_BOS = 50256
_VERSION = 1  # bump when the recipe below changes, so cached folders are rebuilt


def _config_class(arch: str) -> Any:
    import transformers

    names = {
        "gpt2": "GPT2Config",
        "neox": "GPTNeoXConfig",
        "llama": "LlamaConfig",
        "gptneo": "GPTNeoConfig",
        "opt": "OPTConfig",
        "gpt_bigcode": "GPTBigCodeConfig",
        "mistral": "MistralConfig",
        "qwen2": "Qwen2Config",
        "qwen3": "Qwen3Config",
        "gemma": "GemmaConfig",
        "gemma2": "Gemma2Config",
        "gemma3": "Gemma3TextConfig",
        "olmo2": "Olmo2Config",
        "phi3": "Phi3Config",
        "smollm3": "SmolLM3Config",
        "phi": "PhiConfig",
        "stablelm": "StableLmConfig",
        "gptj": "GPTJConfig",
        "bloom": "BloomConfig",
        "mpt": "MptConfig",
    }
    if arch not in names:
        raise ValueError(f"unknown tiny architecture {arch!r}; use one of {list(names)}")
    return getattr(transformers, names[arch])


def tiny_hf_config(
    arch: TinyArch, *, n_layers: int = 2, d_model: int = 64, n_heads: int = 4, n_ctx: int = 128
) -> Any:
    """Return a small Hugging Face config of the given family (GPT-2 vocabulary).

    Every family keeps what makes its positions special: OPT's offset table, partial rotary
    (NeoX ``rotary_pct=0.25``, Phi ``0.5``, StableLM ``0.25``, GPT-J ``rotary_dim=8`` on
    interleaved pairs), sliding windows of 8 tokens (Mistral, Gemma 2/3, GPT-Neo's local
    layers), Gemma 3's local/global bases (every second layer global), SmolLM3's NoPE layers
    (``n_layers`` is raised to 4 so that one exists), ALiBi slopes (BLOOM, MPT).

    Args:
        arch: A family of :data:`TinyArch`. ``"gpt2"`` (learned absolute positions),
            ``"neox"`` (Pythia-style, partial rotary, parallel attention and MLP) and
            ``"llama"`` (full rotary, grouped-query attention, RMSNorm, tied embeddings) are
            the three the bulk of the tests use.
        n_layers: Number of blocks.
        d_model: Residual width.
        n_heads: Attention heads (grouped-query families use ``n_heads // 2`` key-value heads).
        n_ctx: Context length (``n_positions`` / ``max_position_embeddings``).

    Returns:
        The family's ``transformers`` config object.

    Raises:
        ValueError: unknown ``arch``.
    """
    cls = _config_class(arch)
    ids: dict[str, Any] = {"vocab_size": _GPT2_VOCAB, "bos_token_id": _BOS, "eos_token_id": _BOS}
    kv = max(1, n_heads // 2)
    gpt = {"n_embd": d_model, "n_layer": n_layers, "n_head": n_heads, "n_positions": n_ctx}
    modern = {
        "hidden_size": d_model,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": kv,
        "intermediate_size": 2 * d_model,
        "max_position_embeddings": n_ctx,
    }
    head_dim = {"head_dim": d_model // n_heads}
    window = {"sliding_window": 8}
    extra: dict[str, Any] = {
        "gpt2": {**gpt, "n_ctx": n_ctx},  # legacy name, taken by the config's **kwargs
        "gpt_bigcode": gpt,
        "gptj": {**gpt, "rotary_dim": 8},
        "gptneo": {
            "hidden_size": d_model,
            "num_layers": n_layers,
            "num_heads": n_heads,
            "attention_types": [[["global", "local"], max(1, n_layers // 2)]],
            "window_size": 8,
            "max_position_embeddings": n_ctx,
        },
        "opt": {
            "hidden_size": d_model,
            "num_hidden_layers": n_layers,
            "num_attention_heads": n_heads,
            "ffn_dim": 2 * d_model,
            "word_embed_proj_dim": d_model,
            "max_position_embeddings": n_ctx,
        },
        "neox": {
            **{k: v for k, v in modern.items() if k != "num_key_value_heads"},
            "intermediate_size": 4 * d_model,
            "rotary_pct": 0.25,
            "use_parallel_residual": True,
            "hidden_act": "gelu",
            "tie_word_embeddings": False,
        },
        "llama": {**modern, "tie_word_embeddings": True, "rope_theta": 10000.0},
        "mistral": {**modern, **window},
        "qwen2": modern,
        "qwen3": {**modern, **head_dim},
        "gemma": {**modern, **head_dim},
        "gemma2": {**modern, **head_dim, **window},
        "gemma3": {**modern, **head_dim, **window, "sliding_window_pattern": 2},
        "olmo2": modern,
        # pad_token_id 0, not the BOS: Hugging Face zeroes the padding row of the embedding
        "phi3": {**modern, "original_max_position_embeddings": n_ctx, "pad_token_id": 0},
        "smollm3": {
            **modern,
            "num_hidden_layers": max(4, n_layers),
            "no_rope_layer_interval": 4,
            "pad_token_id": 0,
        },
        "phi": {
            **{k: v for k, v in modern.items() if k != "num_key_value_heads"},
            "partial_rotary_factor": 0.5,
        },
        "stablelm": {**modern, "partial_rotary_factor": 0.25},
        "bloom": {"hidden_size": d_model, "n_layer": n_layers, "n_head": n_heads},
        "mpt": {
            "d_model": d_model,
            "n_layers": n_layers,
            "n_heads": n_heads,
            "max_seq_len": n_ctx,
            "expansion_ratio": 2,
        },
    }[arch]
    return cls(**extra, **ids)


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
