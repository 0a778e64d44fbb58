# %% [markdown]
# # Activation patching: where does the positional signal act?
#
# Run the model normally and with positional information removed, then copy one activation at a
# time from the normal run into the ablated one ("restore") and see how much of the change in
# homogenization and in loss comes back. Offline on tiny random models; use
# `load_model("smollm2-135m-instruct")` for a real one (`homoglens patch` runs the full sweep).

# %%
import matplotlib

matplotlib.use("Agg")

from homoglens import corpus_windows, load_model, positional_patching
from homoglens.testing import tiny_model_folder

gpt2 = load_model(tiny_model_folder("gpt2"))
windows = corpus_windows(gpt2, n_seq=4, seq_len=32)

# %% [markdown]
# ## Residual stream x position bins
# A learned-absolute model gets its positions at the embeddings, so restoring block 0's residual
# stream at every position restores everything (effect 1); later blocks and single bins show where
# the signal has been spread.

# %%
result = positional_patching(
    gpt2, windows, how="zero", metric=["mean_pairwise", "loss"], bins=8, progress=False
)
print(result)
print("normal:", result.normal.tolist(), "ablated:", result.ablated.tolist())
print(result.to_pandas().query("metric == 'mean_pairwise'").round(3).head(8))
fig = result.plot("mean_pairwise")

# %% [markdown]
# ## Heads, break direction, and your own metric
# `break` copies the ablated run's activation into the normal run. A metric can be any function
# of the logits that returns the mean over the sequences it is given.

# %%
llama = load_model(tiny_model_folder("llama"))


def last_token_entropy(logits, tokens, mask):
    last = logits[range(len(mask)), mask.sum(1) - 1].log_softmax(-1)
    return -(last.exp() * last).sum(-1).mean()


heads = positional_patching(
    llama,
    corpus_windows(llama, n_seq=4, seq_len=32),
    how="zero",
    component="head",
    direction="break",
    metric=["mean_pairwise", last_token_entropy],
    progress=False,
)
print("normal:", heads.normal.tolist(), "ablated:", heads.ablated.tolist())
print("mean_pairwise effect [layer head]:\n", heads.effect[0].round(decimals=3))
print("last-token entropy after each patch [layer head]:\n", heads.patched[1].round(decimals=4))
print(heads.batching)
