"""Controlled retraining: small causal LMs that differ only in how they get positions.

Three variants, trained on the same Austen text (Sense and Sensibility held out), with the same
tokenizer, sizes, initialisation scheme, data order, optimiser and number of steps:

* ``learned``: GPT-2 architecture (``GPT2LMHeadModel``), learned absolute positions (``wpe``);
* ``rotary``: GPT-NeoX architecture (``GPTNeoXForCausalLM``), rotary positions on every channel
  (``rotary_pct=1``), sequential attention then MLP (``use_parallel_residual=False``);
* ``none``: GPT-2 architecture with ``wpe`` zeroed and frozen (NoPE), so it stays a standard
  GPT-2 folder that every loader reads.

Matched: d_model, layers, heads, MLP width (4 x), activation (``gelu_new``), LayerNorm (eps
1e-5), biases on every linear layer, tied input/output embeddings, no dropout, initialisation
(normal(0, 0.02), residual output projections scaled by 1/sqrt(2 n_layers), zero biases).
What still differs: the GPT-NeoX attention fuses q, k, v per head in another memory layout (the
same function), and GPT-2 has the positional table (trained or frozen at zero).

Tokenizer: a byte-level BPE of ``vocab_size`` (default 4096) trained on the training split with
``tokenizers``; the GPT-2 vocabulary (50,257) would spend most of a CPU budget on the embedding
and the softmax of a model this small.

References:
    Yusupov et al. 2025, arXiv 2508.17126 (controlled experiments without positional features);
    Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in
    Transformers", arXiv 2305.19466 (NoPE); Haviv et al. 2022, arXiv 2203.16634 (causal LMs
    without positional encodings still learn positional information).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, cast

import torch

from homoglens.core.distributed import is_main_process
from homoglens.core.errors import InvalidInputError, TrainingDivergedError
from homoglens.core.validate import as_bool, as_float, as_int
from homoglens.models.assets import staged_output
from homoglens.run.data import HELD_OUT, TokenBatch, split_austen

# The configuration of a controlled retraining run (moved out of :mod:`homoglens.training.train`,
# issue 40): :class:`TrainingConfig`, every field checked at construction, and the bounds it
# checks against (:data:`POSITIONAL_VARIANTS`, :data:`MAX_N_CTX`, :data:`MAX_VOCAB_SIZE`).

PositionalVariant = Literal["learned", "rotary", "none"]
POSITIONAL_VARIANTS: tuple[str, ...] = ("learned", "rotary", "none")


_POSITIVE_FIELDS = (
    "n_layers",
    "d_model",
    "n_heads",
    "vocab_size",
    "steps",
    "batch_size",
    "threads",
)
_MAX_SEED = 2**64 - 1  # the largest seed torch.manual_seed takes
MAX_VOCAB_SIZE = 65_536
"""The largest ``TrainingConfig.vocab_size``: the byte-level BPE trainer allocates for the size
asked up front (10**9 aborts the process), while the Austen training split yields only about
27,000 distinct tokens (every pre-token merged whole), so a larger value trains the same
tokenizer."""
MAX_N_CTX = 4096
"""The largest ``TrainingConfig.n_ctx``: these are tiny controlled models trained on CPU, and
attention costs grow with n_ctx squared (a 100,000-token window runs for minutes per step)."""
_MAX_INTS = {"seed": _MAX_SEED, "vocab_size": MAX_VOCAB_SIZE, "n_ctx": MAX_N_CTX}


def _config_int(name: str, value: Any, low: int, high: int | None) -> int:
    """``value`` as a Python int in [low, high]; the error names the field and its range."""
    try:
        return as_int(name, value, low=low, high=high)
    except InvalidInputError:
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidInputError(
            f"TrainingConfig: {name}={value!r} must be an integer {allowed}{_WHY.get(name, '')}"
        ) from None


_WHY = {
    "vocab_size": (
        ": the Austen training split yields about 27,000 distinct tokens, and the tokenizer "
        "trainer allocates memory for the size asked"
    ),
    "n_ctx": (": these are tiny models trained on CPU, and attention grows with n_ctx squared"),
}


def _config_real(name: str, value: Any, *, strict: bool) -> float:
    """``value`` as a finite Python float, > 0 (``strict``) or >= 0; the error names the field,
    its value and the allowed range."""
    allowed = f"a finite number {'>' if strict else '>='} 0"
    try:
        number = as_float(name, value, low=-math.inf, high=math.inf)
    except (InvalidInputError, TypeError, ValueError, RuntimeError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or (strict and number == 0):
        raise InvalidInputError(f"TrainingConfig: {name}={value!r} must be {allowed}")
    return number


@dataclass(frozen=True)
class TrainingConfig:
    """Everything that defines one training run (saved as ``training.json`` beside the model).

    Attributes:
        variant: ``"learned"``, ``"rotary"`` or ``"none"``.
        n_layers, d_model, n_heads: Model size (d_mlp = 4 d_model), integers >= 1; ``d_model``
            a multiple of ``n_heads`` (an even multiple for ``rotary``).
        n_ctx: Context length and training window length (tokens), in [2, 4096]
            (``MAX_N_CTX``: tiny models trained on CPU; attention grows with n_ctx squared).
        vocab_size: BPE vocabulary size (trained on the training split), in [260, 65536]
            (``MAX_VOCAB_SIZE``; the Austen training split yields about 27,000 distinct
            tokens, so a larger value trains the same tokenizer).
        steps: Optimiser steps, >= 1.
        batch_size: Windows per step, >= 1.
        lr: Peak learning rate (AdamW, linear warm-up then cosine decay to 10 %), finite, > 0.
        warmup: Warm-up steps, >= 0.
        weight_decay: AdamW weight decay (matrices only), finite, >= 0.
        seed: Seed of initialisation and data order, in [0, 2**64 - 1].
        threads: torch threads (results depend slightly on it), >= 1.
        bos: Start every training window with the same special token (``<|endoftext|>``, the
            tokenizer's BOS), followed by ``n_ctx - 1`` text tokens; attention sinks form
            around a fixed first token (Gu et al. 2024, arXiv 2410.10781; Barbero et al. 2025,
            arXiv 2504.02732). The held-out loss is then measured on windows that start with
            it too.

    Every field is checked at construction (and stored as a plain Python value).

    Raises:
        InvalidInputError: a field of the wrong type, NaN or inf, or outside its range; the
            message names the field, its value and what is allowed.
    """

    variant: str = "learned"
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_ctx: int = 128
    vocab_size: int = 4096
    steps: int = 3000
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 2
    bos: bool = False

    def __post_init__(self) -> None:
        """Check every field (type, finite, range) and store it as a plain Python value.

        Raises:
            InvalidInputError: a field of the wrong type, non-finite or out of its range (the
                message names the field, its value and what is allowed).
        """
        if not isinstance(self.variant, str) or self.variant not in POSITIONAL_VARIANTS:
            raise InvalidInputError(
                f"TrainingConfig: variant={self.variant!r} must be one of {POSITIONAL_VARIANTS}"
            )
        ints = {name: 1 for name in _POSITIVE_FIELDS} | {"n_ctx": 2, "warmup": 0, "seed": 0}
        ints["vocab_size"] = 260  # 256 bytes + specials
        for name, low in ints.items():
            high = _MAX_INTS.get(name)
            object.__setattr__(self, name, _config_int(name, getattr(self, name), low, high))
        object.__setattr__(self, "lr", _config_real("lr", self.lr, strict=True))
        object.__setattr__(
            self, "weight_decay", _config_real("weight_decay", self.weight_decay, strict=False)
        )
        try:
            object.__setattr__(self, "bos", as_bool("bos", self.bos))
        except InvalidInputError:
            raise InvalidInputError(
                f"TrainingConfig: bos={self.bos!r} must be True or False"
            ) from None
        if self.d_model % self.n_heads:
            raise InvalidInputError(
                f"TrainingConfig: d_model={self.d_model} must be a multiple of "
                f"n_heads={self.n_heads}; change one of them"
            )
        if self.variant == "rotary" and (self.d_model // self.n_heads) % 2:
            raise InvalidInputError(
                f"TrainingConfig: variant='rotary' rotates pairs of channels, so the head "
                f"width d_model / n_heads = {self.d_model}/{self.n_heads} must be even; change "
                "d_model or n_heads"
            )

    @property
    def name(self) -> str:
        """Folder name of the run: ``tiny-<variant>[-bos][-s<seed>]`` (seed 0 has no suffix)."""
        return (
            f"tiny-{self.variant}"
            + ("-bos" if self.bos else "")
            + (f"-s{self.seed}" if self.seed else "")
        )


__all__ = [
    "MAX_N_CTX",
    "MAX_VOCAB_SIZE",
    "POSITIONAL_VARIANTS",
    "TrainingConfig",
    "build_model",
    "heldout_loss",
    "heldout_windows",
    "split_austen",
    "train_model",
    "train_tokenizer",
    "unigram_entropy",
]


def train_tokenizer(text: str, vocab_size: int, out: Path | None = None) -> Any:
    """Train a byte-level BPE (``tokenizers``) on ``text``; ``<|endoftext|>`` is BOS/EOS/pad.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` (saved into ``out`` when given).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = "<|endoftext|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=special, eos_token=special, pad_token=special
    )
    if out is not None:
        fast.save_pretrained(str(out))
    return fast


def build_model(config: TrainingConfig, vocab_size: int, special_id: int) -> Any:
    """The untrained Hugging Face model of ``config.variant``, initialised with ``config.seed``.

    Returns:
        ``GPT2LMHeadModel`` (learned, none) or ``GPTNeoXForCausalLM`` (rotary).
    """
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(config.seed)
    common = {
        "vocab_size": vocab_size,
        "bos_token_id": special_id,
        "eos_token_id": special_id,
        "tie_word_embeddings": True,
    }
    if config.variant == "rotary":
        hf = GPTNeoXConfig(
            hidden_size=config.d_model,
            num_hidden_layers=config.n_layers,
            num_attention_heads=config.n_heads,
            intermediate_size=4 * config.d_model,
            hidden_act="gelu_new",
            **{"rotary_pct": 1.0},  # a legacy name, taken by the config's **kwargs
            max_position_embeddings=config.n_ctx,
            use_parallel_residual=False,
            attention_bias=True,
            layer_norm_eps=1e-5,
            attention_dropout=0.0,
            hidden_dropout=0.0,
            **common,
        )
        model = GPTNeoXForCausalLM(hf)
        out_proj = ("attention.dense", "mlp.dense_4h_to_h")
    else:
        hf = GPT2Config(
            n_embd=config.d_model,
            n_layer=config.n_layers,
            n_head=config.n_heads,
            n_inner=4 * config.d_model,
            n_positions=config.n_ctx,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
        model = GPT2LMHeadModel(hf)
        out_proj = ("attn.c_proj", "mlp.c_proj")
    _init(model, config, out_proj)
    if config.variant == "none":
        wpe = cast(Any, model).transformer.wpe.weight
        with torch.no_grad():
            wpe.zero_()
        wpe.requires_grad_(False)
    return model


def _init(model: Any, config: TrainingConfig, out_proj: tuple[str, ...]) -> None:
    """Same scheme for every variant: N(0, 0.02) weights, 1/sqrt(2L)-scaled residual outputs,
    zero biases, unit LayerNorms (the GPT-2 paper's initialisation)."""
    scale = 0.02 / math.sqrt(2 * config.n_layers)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif "ln" in name.split(".")[-2] or "layernorm" in name.lower() or "norm" in name:
                param.fill_(1.0)
            elif any(p in name for p in out_proj):
                param.normal_(0.0, scale)
            else:
                param.normal_(0.0, 0.02)


def _token_stream(tokenizer: Any, text: str) -> torch.Tensor:
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    special = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    for para in paragraphs:
        ids.extend(
            tokenizer.encode(re.sub(r"\s*\n\s*", " ", para).strip(), add_special_tokens=False)
        )
        ids.append(special)
    return torch.tensor(ids, dtype=torch.long, device="cpu")


@lru_cache(maxsize=2)
def _prepared_corpus(vocab_size: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Tokenizer trained on the training split, and both splits as token streams (deterministic,
    so cached per vocabulary size within a process)."""
    train_text, held_text = split_austen()
    tokenizer = train_tokenizer(train_text, vocab_size)
    return tokenizer, _token_stream(tokenizer, train_text), _token_stream(tokenizer, held_text)


def heldout_windows(
    tokenizer: Any, *, n_seq: int | None = None, seq_len: int = 128, bos: bool = False
) -> TokenBatch:
    """The held-out novel as training presents text: paragraphs joined by ``<|endoftext|>``,
    cut into consecutive ``seq_len`` windows (as :func:`heldout_loss` evaluates), ``n_seq`` of
    them evenly spaced (``None``: all).

    Args:
        tokenizer: The tokenizer of a model trained by :func:`train_model`.
        n_seq: Windows to keep (evenly spaced over the novel), or ``None`` for all.
        seq_len: Tokens per window, >= 2 (>= 3 with ``bos``), the BOS included.
        bos: Start each window with ``<|endoftext|>`` followed by ``seq_len - 1`` text tokens,
            as a model trained with ``TrainingConfig(bos=True)`` saw its windows.

    Returns:
        A :class:`~homoglens.run.data.TokenBatch` ``[n_seq seq_len]`` without padding.

    Raises:
        InvalidInputError: bad ``n_seq``/``seq_len``, or more windows asked than the novel has.
    """
    if not isinstance(bos, bool):
        raise InvalidInputError(f"bos={bos!r} must be True or False")
    seq_len = as_int("seq_len", seq_len, low=3 if bos else 2)
    stream = _token_stream(tokenizer, split_austen()[1])
    width = seq_len - 1 if bos else seq_len
    available = (len(stream) - 1) // width
    windows = stream[: available * width].view(available, width)
    if n_seq is not None:
        n_seq = as_int("n_seq", n_seq, low=1)
        if n_seq > available:
            raise InvalidInputError(
                f"n_seq={n_seq} exceeds the {available} windows of {seq_len} tokens in the "
                "held-out novel; lower n_seq or seq_len"
            )
        windows = windows[
            torch.div(torch.arange(n_seq, device="cpu") * available, n_seq, rounding_mode="floor")
        ]
    if bos:
        special = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        windows = torch.cat([torch.full_like(windows[:, :1], special), windows], dim=1)
    return TokenBatch(
        tokens=windows.clone(),
        attention_mask=torch.ones_like(windows),
        bos=bos,
        description=f"held-out novel ({HELD_OUT.title()}) as in training: {len(windows)} of "
        f"{available} consecutive windows x {seq_len} tokens, evenly spaced, "
        f"bos={'<|endoftext|>' if bos else 'no'}",
    )


def heldout_loss(
    model: Any,
    tokens: torch.Tensor,
    n_ctx: int,
    *,
    max_windows: int | None = None,
    bos_id: int | None = None,
) -> float:
    """Mean next-token cross-entropy (nats/token) over consecutive ``n_ctx`` windows of
    ``tokens`` (a Hugging Face causal LM, evaluation mode, no gradients). With ``bos_id``,
    each window is that token followed by ``n_ctx - 1`` text tokens (every text token of a
    window is then predicted, the first one from the BOS alone)."""
    width = n_ctx if bos_id is None else n_ctx - 1
    n = (len(tokens) - 1) // width
    if max_windows is not None:
        n = min(n, max_windows)
    windows = tokens[: n * width].view(n, width)
    if bos_id is not None:
        windows = torch.cat([torch.full_like(windows[:, :1], bos_id), windows], dim=1)
    total, count = 0.0, 0
    model.eval()
    with torch.inference_mode():
        for chunk in windows.split(32):
            logits = model(chunk).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
            )
            total += float(loss)
            count += chunk[:, 1:].numel()
    return total / count


def unigram_entropy(tokens: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats) of the unigram distribution of ``tokens``: the loss of a model that
    ignores all context."""
    counts = torch.bincount(tokens, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def train_model(
    config: TrainingConfig,
    out: str | Path,
    *,
    overwrite: bool = False,
    log_every: int = 50,
    save_every: int = 0,
    save_steps: Sequence[int] = (),
    progress: bool = True,
) -> dict[str, Any]:
    """Train one variant deterministically and save it as a Hugging Face folder.

    Writes into ``out``: ``config.json`` + ``model.safetensors`` (standard Hugging Face),
    the tokenizer, ``training.json`` (the config, the loss curve every ``log_every`` steps,
    held-out loss, unigram entropy of the held-out text, wall time, versions), and, when
    checkpoints are asked for, ``checkpoints/step<N>/`` after N optimiser steps (N = 0: the
    initialisation), each a loadable Hugging Face folder of its own (weights, config,
    tokenizer, ``checkpoint.json`` with the step and the loss curve so far), named as Pythia
    names its revisions. Saving checkpoints does not change the training run: the final
    weights are the same bit for bit.

    Args:
        config: The run.
        out: Folder to write: a new or empty folder, or (with ``overwrite=True``) the folder
            of an older run. The run writes into a staged sibling that replaces ``out`` only
            when training and saving have finished: an error or an interrupt leaves an
            existing ``out`` as it was (never old weights beside a new tokenizer) and creates
            nothing otherwise. Torch's thread count, deterministic-algorithms flag and global
            RNG state are restored on exit, normally or not.
        overwrite: Replace an older run in ``out`` (a folder holding ``config.json`` or
            ``training.json``) as a whole, checkpoints and any other file in it included; the
            older run is kept until the new one is saved. Without it such an ``out`` is
            refused before any training (as ``homoglens train`` refuses it without
            ``--overwrite``).
        log_every: Steps between logged training losses.
        save_every: Also keep a checkpoint every this many steps, and one of the
            initialisation (0: none); the last step's is the run folder itself.
        save_steps: Also keep checkpoints after exactly these steps (0..``config.steps``), e.g.
            log-spaced ones, where sinks emerge early.
        progress: Show a progress bar.

    Returns:
        The ``training.json`` content.

    Raises:
        InvalidInputError: ``config`` not a :class:`TrainingConfig`, ``log_every`` < 1,
            ``save_every`` negative, a step in ``save_steps`` outside 0..``config.steps``,
            ``n_ctx`` longer than the training or held-out text; or ``out`` that the run could
            not write (a file, a symbolic link, in a folder this process cannot write, a
            non-empty folder that is no model folder, an older run there without
            ``overwrite=True``, or one with a folder it cannot delete): checked before any
            training.
        TrainingDivergedError: training diverged (a training loss, the weights or the
            held-out loss became NaN or inf); the message names the step and the loss and
            suggests a lower ``lr``. Nothing is saved: an existing ``out`` is left as it was.

    References:
        Yusupov et al. 2025, arXiv 2508.17126.
    """
    if not isinstance(config, TrainingConfig):
        raise InvalidInputError(
            f"config={config!r} must be a TrainingConfig; build one with TrainingConfig(...)"
        )
    if not isinstance(out, (str, os.PathLike)):
        raise InvalidInputError(f"out={out!r} must be a folder path (str or pathlib.Path)")
    progress = as_bool("progress", progress)
    overwrite = as_bool("overwrite", overwrite)
    log_every = as_int("log_every", log_every, low=1)
    out = Path(out).expanduser()
    steps = checkpoint_steps(config.steps, save_every, save_steps)
    if is_main_process():  # the one that writes (staged_output)
        _check_output_folder(out, overwrite=overwrite)
    with _torch_globals(config.threads), staged_output(out) as tmp:
        return _train(config, tmp, log_every, progress, steps)


_RUN_FILES = ("config.json", "training.json")  # what marks an older run (a model folder)


def _check_output_folder(out: Path, *, overwrite: bool) -> None:
    """Refuse, before any training, an ``out`` the finished run could not be moved into:
    :func:`~homoglens.models.assets.staged_output` writes a sibling of ``out`` and then replaces
    ``out`` (deleting an older run there), so the first existing folder above ``out`` must take
    a new folder, a non-empty ``out`` must be a model folder (never a folder of other files)
    replaced only with ``overwrite``, and every folder of an older run must let its entries be
    deleted.

    Raises:
        InvalidInputError: names the folder in the way and the fix.
    """
    where = f"train_model cannot write the run into {str(out)!r}"
    try:
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            kind = "a symbolic link" if out.is_symlink() else "a file"
            raise InvalidInputError(
                f"{where}: it is {kind}, which the run would replace; give another folder "
                "path (a new or empty folder)"
            )
        older = [name for name in _RUN_FILES if (out / name).is_file()]
        if older and not overwrite:  # a run folder is replaced whole: never without a word
            raise InvalidInputError(
                f"{where}: it holds an older run ({', '.join(older)}), which the run would "
                "replace as a whole; pass overwrite=True to replace it (the older run is kept "
                "until the new one is saved), or choose another folder"
            )
        parent = out.parent
        while not parent.exists():  # the missing folders are created on the way
            parent = parent.parent
        if not parent.is_dir():
            raise InvalidInputError(
                f"{where}: {str(parent)!r} is a file, not a folder; choose another out"
            )
        try:
            probe = tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=parent)
        except OSError as err:
            raise InvalidInputError(
                f"{where}: the folder {str(parent)!r} is not writable ({err.strerror}); choose "
                f"an out folder you can write to, or make {str(parent)!r} writable "
                "(chmod u+w)"
            ) from None
        os.rmdir(probe)
        if out.is_dir() and not any((out / name).is_file() for name in _RUN_FILES):
            if any(out.iterdir()):  # the run replaces out as a whole: never a user's folder
                raise InvalidInputError(
                    f"{where}: it holds files but no model ({' or '.join(_RUN_FILES)}), and "
                    "the run replaces the folder as a whole; choose a new or empty folder"
                )
        if out.is_dir():
            inner = (p for p in out.rglob("*") if p.is_dir() and not p.is_symlink())
            for folder in (out, *inner):
                if not os.access(folder, os.W_OK | os.X_OK):
                    raise InvalidInputError(
                        f"{where}: it holds an older run whose folder {str(folder)!r} is not "
                        f"writable, so it could not be replaced; make it writable (chmod -R "
                        f"u+w {str(out)!r}) or choose another out"
                    )
    except OSError as err:  # e.g. a folder above out that cannot be listed
        raise InvalidInputError(f"{where}: {err}; choose another out folder") from None


def checkpoint_steps(total: int, save_every: int, save_steps: Sequence[int]) -> tuple[int, ...]:
    """The sorted optimiser steps after which :func:`train_model` keeps a checkpoint.

    Raises:
        InvalidInputError: ``save_every`` negative, or a step outside 0..``total``.
    """
    every = as_int("save_every", save_every, low=0)
    steps = {as_int("save_steps", s, low=0) for s in save_steps}
    if any(s > total for s in steps):
        raise InvalidInputError(
            f"save_steps={sorted(steps)} must lie in 0..{total} (the run's steps)"
        )
    if every:  # the last step is the run's final model, saved in the run folder itself
        steps |= set(range(0, total, every))
    return tuple(sorted(steps))


@contextlib.contextmanager
def _torch_globals(threads: int) -> Iterator[None]:
    """Set what training needs (``threads`` CPU threads, deterministic algorithms) and put
    back every torch global it changes (those two and the global RNG state) on exit, also on
    an exception or KeyboardInterrupt."""
    saved = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_rng_state(),
    )
    try:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(True)
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
        torch.set_rng_state(saved[3])


def _finite_weights(model: Any) -> bool:
    """Whether every parameter of ``model`` is finite (one read back to the host)."""
    with torch.no_grad():
        return bool(torch.stack([p.isfinite().all() for p in model.parameters()]).all())


def _diverged(config: TrainingConfig, what: str) -> TrainingDivergedError:
    """The error of a run whose loss or weights became NaN or inf."""
    return TrainingDivergedError(
        f"training {config.name} diverged: {what} (lr={config.lr:g}, warmup={config.warmup}, "
        f"{config.steps} steps); nothing was saved and an existing output folder was left as "
        f"it was. Lower the learning rate (e.g. lr={config.lr / 10:g}) or lengthen the warm-up"
    )


def _train(
    config: TrainingConfig,
    out: Path,
    log_every: int,
    progress: bool,
    checkpoints: tuple[int, ...] = (),
) -> dict[str, Any]:
    from importlib.metadata import version

    from tqdm.auto import tqdm

    tokenizer, train_ids, held_ids = _prepared_corpus(config.vocab_size)
    held_width = config.n_ctx - 1 if config.bos else config.n_ctx
    if len(train_ids) - config.n_ctx - 1 < 1 or (len(held_ids) - 1) // held_width < 1:
        raise InvalidInputError(
            f"n_ctx={config.n_ctx} leaves no window of the training text ({len(train_ids)} "
            f"tokens) or of the held-out novel ({len(held_ids)} tokens); lower n_ctx"
        )
    tokenizer.save_pretrained(str(out))
    special = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model = build_model(config, len(tokenizer), special)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    optim = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < config.warmup:
            return config.lr * (step + 1) / config.warmup
        frac = (step - config.warmup) / max(1, config.steps - config.warmup)
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    gen = torch.Generator().manual_seed(config.seed)
    n_start = len(train_ids) - config.n_ctx - 1
    curve: list[tuple[int, float]] = []
    model.train()
    start = time.perf_counter()
    running = 0.0
    text_len = config.n_ctx - 1 if config.bos else config.n_ctx

    def keep(step: int) -> None:
        if not _finite_weights(model):  # a checkpoint syncs anyway: check what it saves
            raise _diverged(config, f"the weights after step {step} hold NaN or inf")
        folder = out / "checkpoints" / f"step{step}"
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        record = {"step": step, "config": asdict(config), "loss_curve": curve}
        (folder / "checkpoint.json").write_text(json.dumps(record, indent=2))

    if 0 in checkpoints:
        keep(0)
    for step in tqdm(range(config.steps), desc=f"train {config.name}", disable=not progress):
        starts = torch.randint(0, n_start, (config.batch_size,), generator=gen, device="cpu")
        batch = torch.stack([train_ids[s : s + text_len] for s in starts.tolist()])
        if config.bos:
            batch = torch.cat([torch.full_like(batch[:, :1], special), batch], dim=1)
        for group in optim.param_groups:
            group["lr"] = lr_at(step)
        loss = model(batch, labels=batch).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        value = float(loss.detach())  # the loop's one read of the loss (no extra sync)
        if not math.isfinite(value):
            raise _diverged(config, f"the training loss of step {step + 1} is {value}")
        running += value
        if (step + 1) % log_every == 0 or step + 1 == config.steps:
            count = (step % log_every) + 1
            curve.append((step + 1, running / count))
            running = 0.0
        if step + 1 in checkpoints:
            keep(step + 1)
    wall = time.perf_counter() - start
    model.eval()
    if not _finite_weights(model):
        raise _diverged(config, f"the final weights (step {config.steps}) hold NaN or inf")
    held = heldout_loss(model, held_ids, config.n_ctx, bos_id=special if config.bos else None)
    if not math.isfinite(held):
        raise _diverged(config, f"the held-out loss of the final weights is {held}")
    record = {
        "config": asdict(config),
        "loss_curve": curve,
        "heldout_loss": held,
        "heldout_unigram_entropy": unigram_entropy(held_ids, len(tokenizer)),
        "heldout": HELD_OUT.title(),
        "train_tokens": len(train_ids),
        "heldout_tokens": len(held_ids),
        "wall_seconds": wall,
        "versions": {name: version(name) for name in ("torch", "transformers", "tokenizers")},
    }
    model.save_pretrained(str(out))
    (out / "training.json").write_text(json.dumps(record, indent=2))
    return record
