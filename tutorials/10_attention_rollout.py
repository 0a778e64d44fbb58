# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # Attention rollout: does causal attention pile up on the first tokens with depth?
#
# Wu et al. 2025 ("On the Emergence of Position Bias in Transformers", arXiv 2502.01951) show
# that with a causal mask, attention composed over layers concentrates on the early positions
# as depth grows, and that positional encodings (decay, rotary) counteract it in part. The
# composed attention is the rollout of Abnar & Zuidema 2020 (arXiv 2005.00928): per block the
# attention averaged over heads, A_l, multiplied through the blocks, R_l = A_l R_{l-1} (Wu et
# al.'s plain product, `residual=False`; `residual=True` mixes in the residual stream as
# (A_l + I) / 2). We read, per depth, the mean cumulative attention each key position receives
# and the mass on the first 4 keys, against the exact null of uniform causal attention (every
# query attends equally to its prefix): causal mixing with no positional preference.
# The shipped tiny models are one training seed each, identical but for the positional scheme
# (learned, rotary, none); they read the same held-out Austen windows, so differences are
# paired by window.

# %%
# Pick the models. Offline default: the three shipped tiny models, then the embedded
# SmolLM2-135M-Instruct (30 blocks, rotary). Any decoder-only model works.
MODELS = ["homoglens/tiny-learned", "homoglens/tiny-rotary", "homoglens/tiny-none"]
MODEL = "smollm2-135m-instruct"
N_SEQ, FIRST_K = 48, 4  # held-out windows of 128 tokens; keys counted as "first"

# %%
import pandas as pd
from IPython.display import display

from homoglens import attention_rollout, corpus_windows, load_model, uniform_causal_rollout
from homoglens.core.stats import estimate
from homoglens.training.train import heldout_windows

pd.set_option("display.width", 150)

# %% [markdown]
# ## The null in closed form
# Uniform causal attention alone concentrates on the first keys as depth grows: after d blocks
# query q's rollout on key k is h_{d-1}(1/(k+1), ..., 1/(q+1)) / (q+1). Mean over the queries
# of a 128-token window, mass on the first 4 keys:

# %%
null = uniform_causal_rollout(128, 8, residual=False)
print([round(float(v), 4) for v in null.mean(1)[:, :FIRST_K].sum(-1)])

# %% [markdown]
# ## The three tiny models (plain product, Wu et al.'s analysis)

# %%
rollouts = {}
for name in MODELS:
    model = load_model(name)
    windows = heldout_windows(model.tokenizer, n_seq=N_SEQ, seq_len=128)
    rollouts[name] = attention_rollout(
        model, windows, residual=False, first_k=FIRST_K, progress=False
    )
    print(rollouts[name])
table = pd.concat(
    {name: r.first_k_table(n_boot=1000) for name, r in rollouts.items()}, names=["model"]
)
print(table.round(4).to_string())

# %%
learned, rotary, none = (rollouts[name] for name in MODELS)
display(learned.plot())
display(rotary.plot())
display(none.plot())

# %% [markdown]
# ## Do positions counteract the concentration? NoPE minus each positional model
# Per-window first-4 mass at the last block, paired by window (the same windows for all three
# models), with a block bootstrap over windows.

# %%
last = {name: r.window_first_k[:, -1] for name, r in rollouts.items()}
for name in MODELS[:2]:
    diff = estimate([last["homoglens/tiny-none"][None], last[name][None]], weights=[1, -1])
    print(f"none - {name}: {diff.value:.4f} [{diff.ci_low:.4f}, {diff.ci_high:.4f}]")

# %% [markdown]
# ## SmolLM2-135M: 30 blocks
# Over 30 blocks the plain product puts almost all of the rollout on the first keys (the null
# too: 0.9995 after 10 blocks on 64-token windows), so the residual form (A + I) / 2 is shown;
# `residual=False` gives the plain product.

# %%
smol = load_model(MODEL)
smol_windows = corpus_windows(smol, "austen-heldout", n_seq=8, seq_len=64)
smol_rollout = attention_rollout(smol, smol_windows, residual=True, first_k=FIRST_K, progress=False)
print(smol_rollout)
print(smol_rollout.first_k_table(n_boot=1000).iloc[[0, 3, 9, 19, 29]].round(4).to_string())
smol_rollout.plot()

# %% [markdown]
# ## Reading
# Partly agrees with Wu et al. 2025. In every model the rollout's mass on the first 4 keys
# grows with depth (plain product; 48 held-out Austen windows of 128 tokens; 95 % block-bootstrap
# intervals, unit = windows): after the last of 4 blocks it is 0.297 [0.286, 0.308] with
# learned positions, 0.281 [0.274, 0.287] with rotary and 0.426 [0.412, 0.440] without
# positions (NoPE), and the model without positions concentrates most, by 0.129 [0.119, 0.139]
# over learned and 0.145 [0.134, 0.157] over rotary (paired by window), as Wu et al.'s claim
# that positional encodings counteract the causal mask's pull toward the start predicts. But
# every trained model concentrates less than the uniform-causal null (0.706 after 4 blocks):
# their attention favours nearby keys beyond what the mask alone induces, NoPE included
# (excess -0.280), so the concentration here is weaker than causal mixing with no positional
# preference, not stronger. SmolLM2-135M (residual form, only 8 windows of 64 tokens) tracks
# the null over its 30 blocks (0.848 [0.766, 0.929] after 10 blocks against 0.864), both near 1
# by block 20. Each model is one training seed, so the scheme differences are differences
# between three trained models, not between positional schemes in general.
