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
# # Activation patching: where does the positional signal act?
#
# Run the model normally and with positional information removed, then copy one activation at a
# time from the normal run into the ablated one ("restore") and see how much of the change in
# homogenization and in loss comes back (normalised effect: 0 = none, 1 = full restoration).

# %%
# Pick the models. Offline defaults: the shipped homoglens/tiny-learned (GPT-2 architecture,
# learned positions) and the embedded SmolLM2-135M (rotary). With the Hugging Face Hub: "gpt2"
# and "EleutherAI/pythia-70m"; residual patching works on any decoder-only model, and
# component="positions" on the 20 families of the table (e.g. "Qwen/Qwen2.5-0.5B",
# "google/gemma-2-2b", "bigscience/bloom-560m").
LEARNED_MODEL = "homoglens/tiny-learned"
ROTARY_MODEL = "smollm2-135m-instruct"

# %%
from homoglens import corpus_windows, load_model, positional_patching

learned = load_model(LEARNED_MODEL)
windows = corpus_windows(learned, n_seq=8, seq_len=64, bos="never")

# %% [markdown]
# ## Residual stream x position bins
# A learned-absolute model gets its positions at the embeddings, so restoring block 0's residual
# stream at every position restores everything (effect 1); later blocks and single bins show where
# the signal has been spread.

# %%
result = positional_patching(
    learned, windows, how="zero", metric=["mean_pairwise", "loss"], bins=8, progress=False
)
print(result)
print("normal:", result.normal.tolist(), "ablated:", result.ablated.tolist())
print(result.to_pandas().query("metric == 'mean_pairwise'").round(3).head(8))
result.plot("mean_pairwise")

# %% [markdown]
# ## Heads, break direction, and your own metric
# `break` copies the ablated run's activation into the normal run. A metric can be any function
# of the logits that returns the mean over the sequences it is given. Three blocks of the rotary
# model keep this quick; `homoglens patch` runs full sweeps.

# %%
rotary = load_model(ROTARY_MODEL)


def last_token_entropy(logits, tokens, mask):
    last = logits[range(len(mask)), mask.sum(1) - 1].log_softmax(-1)
    return -(last.exp() * last).sum(-1).mean()


n_layers = rotary.cfg.n_layers
heads = positional_patching(
    rotary,
    corpus_windows(rotary, n_seq=4, seq_len=32),
    how="zero",
    component="head",
    direction="break",
    layers=[0, n_layers // 2, n_layers - 1],
    metric=["mean_pairwise", last_token_entropy],
    progress=False,
)
print("normal:", heads.normal.tolist(), "ablated:", heads.ablated.tolist())
print("mean_pairwise effect [layer head]:\n", heads.effect[0].round(decimals=3))
print("last-token entropy after each patch [layer head]:\n", heads.patched[1].round(decimals=4))
print(heads.batching)
