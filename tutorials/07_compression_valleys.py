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
# # Compression valleys and attention sinks: two sides of one coin?
#
# Queipo-de-Llano et al. 2025 (arXiv 2510.06477) report that when the first (BOS) token's
# residual norm spikes by orders of magnitude in the middle layers, the matrix entropy of the
# token representations falls into a valley and nearly every head becomes an attention sink,
# in the same layers; and that ablating the first token's massive activation removes the
# valley. Here: the three curves on one layer axis for one model, and the ablation (Sun et
# al.'s `set_zero` of the massive dimensions of the first token, at the entry where Sun et
# al.'s rule finds them).
#
# The entropy is the paper's: the Shannon entropy of the normalised squared singular values of
# each window's raw (uncentred) token matrix, over log min(T, d_model), so a token with a
# massive norm dominates the spectrum (homoglens' profile `matrix_entropy` uses unit rows and
# would not see the spike). The sink rate is Gu et al.'s: the fraction of a block's heads whose
# mean attention on key 0 exceeds eps = 0.3.

# %%
# Pick the model. Offline default: the embedded SmolLM2-135M-Instruct (Llama architecture,
# a BOS token, massive activations on it). With the Hugging Face Hub: the paper's
# "EleutherAI/pythia-410m", "Qwen/Qwen2.5-1.5B", "meta-llama/Llama-3.2-1B", ...
MODEL = "smollm2-135m-instruct"
N_SEQ, SEQ_LEN = 8, 64  # small, so that the notebook runs in about a minute on a laptop CPU

# %%
import pandas as pd

from homoglens import compression_valleys, corpus_windows, load_model

pd.set_option("display.width", 140)
pd.set_option("display.max_columns", 12)

model = load_model(MODEL)
windows = corpus_windows(model, n_seq=N_SEQ, seq_len=SEQ_LEN)

# %% [markdown]
# ## One pass intact, one with the first token's massive dimensions zeroed

# %%
cv = compression_valleys(model, windows, eps=0.3, progress=False)
print(cv)
print(f"ablated: entry {cv.ablation_layer}, dims {list(cv.ablation_dims)} ({cv.ablation_sites})")
table = cv.to_pandas()
print(table.round(3).to_string(index=False))

# %% [markdown]
# ## The paper's figure, redrawn: norm spike, entropy valley and sink rate by layer

# %%
cv.plot()

# %% [markdown]
# ## The headline numbers (mean over windows, 95 % block-bootstrap interval)
#
# `depth`: entropy at the highest entry before the valley minus entropy at the valley;
# `recovery`: entropy with the ablation minus entropy without it, at the valley entry.

# %%
print(cv.headline_table().round(3).to_string(index=False))
valley = table.set_index("layer").loc[cv.valley_layer]
print(
    f"valley at entry {cv.valley_layer}: entropy {valley.entropy:.3f} -> ablated "
    f"{valley.ablated_entropy:.3f}; norm ratio {valley.norm_ratio:.0f} -> "
    f"{valley.ablated_norm_ratio:.1f}; sink rate {valley.sink_rate:.2f} -> "
    f"{valley.ablated_sink_rate:.2f}"
)

# %% [markdown]
# ## Reading
#
# This agrees with the paper on SmolLM2-135M-Instruct (8 Austen windows of 64 tokens): the three
# curves move together. The first token's norm over the median of the others jumps from 1.3 at
# entry 11 to 188 at entry 12 (||x_0|| about 25,000), and there the raw-row matrix entropy
# falls from 0.56 to 0.004 (the valley, entries 12 to 28) and the sink rate reaches 0.86 to 1.
# An earlier, smaller spike (ratio about 10, entries 3 to 9) comes with a shallower valley
# (entropy 0.22 to 0.39) and a sink rate of about 0.6. Where the ratio falls back to 1.2
# (entries 10 and 11), the entropy rises to 0.52 to 0.56 and no head is a sink. Sun et al.'s
# rule finds two massive dimensions of the first token at entry 12 (247 and 507). Zeroing them
# there raises the entropy at the valley by 0.212 (95 % block-bootstrap interval [0.205, 0.219];
# unit = windows, n = 8), to 0.22. That is the level of the earlier shallow valley, not the 0.75
# of the embeddings. So the ablation removes the deep valley but not all compression: the other
# dimensions keep the first token's norm ratio near 15. It also leaves many sinks (ablated sink
# rate 0.08 to 1 after entry 12). The valley's depth (entropy at entry 0 minus entropy at entry
# 12) is 0.742 [0.713, 0.770]. This is one model and one corpus: the intervals cover only the
# sampling of windows.
