# %% [markdown]
# # Attention sinks and massive activations (work in progress)
#
# Which heads dump their attention on the first token, which residual dimensions carry massive
# activations, and how much does removing a sink change homogenization downstream?
# (Gu et al. 2024, arXiv 2410.10781; Sun et al. 2024, arXiv 2402.17762; Barbero et al. 2025,
# arXiv 2504.02732.) Offline on a tiny random Llama; use `load_model("smollm2-135m-instruct")`
# for real sinks (its head L18H8 puts all of its attention on the first token).

# %%
import matplotlib

matplotlib.use("Agg")

from homoglens import (
    corpus_windows,
    fast_sink_attribution,
    load_model,
    massive_activations,
    sink_attribution,
    sink_scores,
)
from homoglens.testing import tiny_model_folder

model = load_model(tiny_model_folder("llama"))
windows = corpus_windows(model, n_seq=6, seq_len=32)

# %% [markdown]
# ## Sink scores: mass on key 0, Gu et al. importance and sink rate

# %%
scores = sink_scores(model, windows, progress=False)
print(scores)
print(scores.top_heads(4).round(3))
fig = scores.plot()

# %% [markdown]
# ## Massive activations: max |x| / median |x| per token

# %%
acts = massive_activations(model, windows, progress=False)
print(acts)
print(acts.top_dims(2))

# %% [markdown]
# ## Removing sinks: exact (one rerun per head) and first-order (all heads at once)

# %%
exact = sink_attribution(model, windows, top_k=3, edge_k=4, progress=False)
print(exact.summary().round(4))
fast = fast_sink_attribution(model, windows, progress=False)
print("first-order estimate per (layer, head):")
print(fast)
