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
# # The controlled comparison: learned, rotary and no positions
#
# The paper's controlled experiment retrains models without positional features and compares
# (Yusupov et al. 2025, arXiv 2508.17126). homoglens ships three small models trained that way
# (same data, tokenizer, sizes, optimiser and steps; only the positional scheme differs) and
# compares them on the same held-out windows, paired by window, with block-bootstrap intervals
# (consecutive windows of one novel are correlated). With the shipped replicate statistics
# (`REPLICATED_MODELS`: three training seeds per scheme) a scheme is one model and its seeds
# are the unit of replication. See docs/training.md for how they were trained and
# docs/findings.md for the full run.

# %%
# Pick the models. Offline default: the three shipped models. Any models that share one
# tokenizer can be compared (e.g. your own: `homoglens train --out my-models`, then
# {"learned": "my-models/tiny-learned", ...}).
MODELS = ["homoglens/tiny-learned", "homoglens/tiny-rotary", "homoglens/tiny-none"]
N_SEQ = 64  # windows of the held-out novel (None: all 1365, several minutes)

# %%
import warnings

import pandas as pd

from homoglens import compare_models

pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 70)

comparison = compare_models(MODELS, n_seq=N_SEQ, n_boot=500, block=4, progress=False)
print(comparison)
print(comparison.settings["data"])

# %% [markdown]
# ## Each model: loss, homogenization, edges, sinks (mean over sequences, 95 % CI)

# %%
summary = comparison.summary()
print(summary.pivot(index="statistic", columns="model", values="value").round(4))
comparison.plot()

# %% [markdown]
# ## Homogenization by layer: raw mean pairwise cosine, and centred H (mean off-diagonal of
# W = M - C: what a window's tokens share beyond what every window shares at those positions)

# %%
print(comparison.layer_table().round(4))

# %% [markdown]
# ## Paired differences: no positions minus each positional model

# %%
print(comparison.differences(reference="homoglens/tiny-none").round(4))

# %% [markdown]
# ## Positional ablation inside each model (the NoPE model's rows are exactly 0: a check)

# %%
effects = comparison.ablation_effects()
print(effects[effects["statistic"].isin(["loss", "homogenization", "matched_first"])].round(4))

# %% [markdown]
# ## Claims C1-C3
# One pre-declared primary test per reading and model, Holm-adjusted, with a smallest effect
# size of interest (0.01 cosine, 0.01 nats): "holds" = significant on the predicted side,
# "equivalent" = smaller than the SESOI (TOST), "fails" = significant on the other side.
# Each model here is one training seed, so the intervals are over windows only.

# %%
with warnings.catch_warnings(record=True) as caught:  # shown as notes below, not in red
    warnings.simplefilter("always")
    claims = comparison.claims()
for note in dict.fromkeys(str(w.message) for w in caught):
    print("note:", note)
columns = ["claim", "reading", "test", "model", "value", "ci_low", "ci_high", "p_holm", "verdict"]
print(claims[claims["primary"]][columns].round(4).to_string())

# %% [markdown]
# Windows of one model, for your own statistics (every tensor is `[seq]` or `[seq layer]`,
# paired across models):

# %%
per_seq = comparison.per_sequence("homoglens/tiny-rotary")
print({name: tuple(values.shape) for name, values in per_seq.items()})
