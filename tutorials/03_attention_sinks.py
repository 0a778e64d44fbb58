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
#
# %% [markdown]
# # Attention sinks and massive activations
#
# Which heads dump their attention on the first token, which residual dimensions carry massive
# activations, and how much does removing a sink change homogenization downstream?
# (Gu et al. 2024, arXiv 2410.10781; Sun et al. 2024, arXiv 2402.17762; Barbero et al. 2025,
# arXiv 2504.02732.)

# %%
# Pick the model. Offline default: the embedded SmolLM2-135M-Instruct (real sinks: its head
# L18H8 puts nearly all of its attention on the first token). With the Hugging Face Hub: "gpt2"
# or "EleutherAI/pythia-70m" (Gu et al. measure them without a BOS: pass bos="never"); the
# sink and massive-activation papers also measure "facebook/opt-125m", "meta-llama/Llama-3.2-1B",
# "mistralai/Mistral-7B-v0.1" and "microsoft/phi-2". Any decoder-only model TransformerLens
# loads works here, in the table or not.
MODEL = "smollm2-135m-instruct"

# %%
import pandas as pd

from homoglens import (
    attention_view,
    corpus_windows,
    load_model,
    massive_activations,
    sink_attribution,
    sink_scores,
)

pd.set_option("display.width", 140)
pd.set_option("display.max_columns", 10)

model = load_model(MODEL)
windows = corpus_windows(model, n_seq=6, seq_len=48)

# %% [markdown]
# ## Sink scores: mass on key 0, Gu et al. importance and sink rate

# %%
scores = sink_scores(model, windows, progress=False)
print(scores)
print(scores.top_heads(5).round(3))
scores.plot()

# %% [markdown]
# ## Massive activations: max |x| / median |x| per token

# %%
acts = massive_activations(model, windows, progress=False)
print(acts)
print(acts.top_dims(2))

# %% [markdown]
# ## The strongest sink heads on one sentence (circuitsvis; renders in Jupyter)

# %%
top = scores.top_heads(3)
view = attention_view(
    model,
    "It is a truth universally acknowledged, that a single man",
    list(zip(top["layer"], top["head"], strict=True)),
)
view

# %% [markdown]
# ## Removing sinks: exact (one rerun per head, plus all together) and first order (all heads)
#
# `delta` = ablated - base of three metrics at the last block's output: mean_pairwise, and the
# first/last-edge excess (mean to_others of the first/last `edge_k` tokens minus the middle).

# %%
exact = sink_attribution(model, windows, top_k=3, edge_k=8, progress=False)
print(exact.rerun)
print(exact.summary().round(4))
fast = sink_attribution(model, windows, method="fast", edge_k=8, progress=False)
print(fast.to_pandas().round(4).head())
print("fast vs exact on the exact heads:", round(exact.correlation(fast), 3))
exact.plot()

# %% [markdown]
# Mean-ablating a head (its output replaced by its corpus mean) instead of removing its sink:

# %%
mean = sink_attribution(model, windows, ablation="mean", top_k=2, edge_k=8, progress=False)
print(mean.summary().round(4))
