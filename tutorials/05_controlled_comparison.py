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
# compares them on the same held-out sequences, paired by sequence, with bootstrap intervals.
# See docs/training.md for how they were trained and docs/findings.md for the full run.

# %%
# Pick the models. Offline default: the three shipped models. Any models that share one
# tokenizer can be compared (e.g. your own: `homoglens train --out my-models`, then
# {"learned": "my-models/tiny-learned", ...}).
MODELS = ["homoglens/tiny-learned", "homoglens/tiny-rotary", "homoglens/tiny-none"]
N_SEQ = 64  # windows of the held-out novel (None: all 1365, about 2 minutes)

# %%
import pandas as pd

from homoglens import compare_models

pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 70)

comparison = compare_models(MODELS, n_seq=N_SEQ, n_boot=500, progress=False)
print(comparison)
print(comparison.settings["data"])

# %% [markdown]
# ## Each model: loss, homogenization, edges, sinks (mean over sequences, 95 % CI)

# %%
summary = comparison.summary()
print(summary.pivot(index="statistic", columns="model", values="value").round(4))
comparison.plot()

# %% [markdown]
# ## Homogenization by layer: raw, baseline, adjusted

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
print(effects[effects["statistic"].isin(["loss", "adjusted_last", "first_excess"])].round(4))

# %% [markdown]
# ## Claims C1-C3
# "holds": the interval lies on the side the claim predicts; "fails": on the other side.

# %%
print(comparison.claims()[["claim", "test", "model", "value", "ci_low", "ci_high", "verdict"]])

# %% [markdown]
# Sequences of one model, for your own statistics (every tensor is `[seq]`, paired across
# models):

# %%
per_seq = comparison.per_sequence("homoglens/tiny-rotary")
print({name: round(float(values.mean()), 4) for name, values in per_seq.items()})
