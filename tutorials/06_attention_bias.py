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
# # Attention bias and sequence length: testing "biased toward extremal positions"
#
# The paper's abstract says tokens lose distinctiveness "particularly when biased toward
# extremal positions" (Yusupov et al. 2025, arXiv 2508.17126). Here that is an intervention
# with a dose: every biased row of attention becomes softmax(beta log A + b phi), phi marking
# the first keys, the recent ones, the query itself, an ALiBi slope or a middle band (the
# specificity control). We watch homogenization (H_W), the distance-matched edge excess, SP and
# the loss respond, check the manipulation took (mass on the biased keys, KL), and read the
# slope at b = 0, the in-distribution answer. Then we sweep the sequence length, the only place
# where an end effect of a causal model can show.

# %%
# Pick the model. Offline default: the embedded SmolLM2-135M-Instruct (Llama architecture, a
# strong first-token sink). With the Hugging Face Hub: "gpt2", "EleutherAI/pythia-70m",
# "Qwen/Qwen2.5-0.5B", ... (any model whose attn.hook_pattern TransformerLens can write).
MODEL = "smollm2-135m-instruct"
N_SEQ, SEQ_LEN = 8, 64  # small, so that the notebook runs in a minute on a laptop CPU

# %%
import warnings

import pandas as pd

from homoglens import (
    attention_bias_study,
    attention_received,
    biased_attention,
    corpus_windows,
    length_study,
    load_model,
)

pd.set_option("display.width", 150)
pd.set_option("display.max_columns", 12)

model = load_model(MODEL)
windows = corpus_windows(model, n_seq=N_SEQ, seq_len=SEQ_LEN)

# %% [markdown]
# ## The intervention on its own
# `biased_attention` is a context manager: every forward pass inside runs biased, and nothing
# stays attached afterwards.

# %%
tokens = windows.tokens[:2]
plain = model(tokens)
with biased_attention(model, kind="first", strength=2.0):
    biased = model(tokens)
print("max |logit change|:", float((biased - plain).detach().abs().max()))

# %% [markdown]
# ## A dose-response on the first keys
# Strengths are b in nats per unit of phi; the unbiased run (b = 0) is always included and is
# the unhooked model bit for bit. `gradient_windows` adds the exact derivative at zero (forward
# -mode autograd) as a cross-check of the central difference.

# %%
# Where every window gives the same value, a slope has no spread and so no interval: homoglens
# warns each time; here the warnings are gathered into one note each.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    study = attention_bias_study(
        model,
        windows,
        kind="first",
        strengths=[-2, -1, -0.25, 0, 0.25, 1, 2],
        edge_k=4,
        gradient_windows=2,
        block=2,
        progress=False,
    )
    print(study)
    print(study.curve("homogenization").round(4))
    print(study.curve("mass", None)[["strength", "value", "kl"]].round(4))
    print(study.slope_at_zero("homogenization"))
    figure = study.plot()
for note in dict.fromkeys(str(w.message) for w in caught):
    print("note:", note)
figure

# %% [markdown]
# ## Kinds at a matched perturbation size
# The dose is also given as the mean KL(A' || A) per biased row, so kinds compare at the same
# size of push. `middle` is the specificity control: if any push raises H_W, it is not about
# the edges.

# %%
rows = []
for kind in ("first", "recent", "middle", "temperature"):
    strengths = [0.8, 0.95, 1.0, 1.05, 1.25] if kind == "temperature" else [-1, -0.25, 0, 0.25, 1]
    s = attention_bias_study(
        model, windows, kind=kind, strengths=strengths, edge_k=4, block=2, progress=False
    )
    slope = s.slope_at_zero("homogenization")
    rows.append(
        {
            "kind": kind,
            "slope at zero": slope.central,
            "ci_low": slope.ci_low,
            "ci_high": slope.ci_high,
            "kl at the largest": float(s.kl[-1]),
        }
    )
pd.DataFrame(rows).round(4)

# %% [markdown]
# ## Homogenization by attention received
# Which key positions receive attention, and do the tokens that attend them move toward them
# (the attractor shift), in proportion to the attention they pay?

# %%
received = attention_received(model, windows, progress=False)
print(received.to_pandas().groupby("block")[["slope", "correlation"]].first().round(4).tail())
received.plot()

# %% [markdown]
# ## Over sequence length
# One pass over the longest windows; every shorter length is a prefix (a causal model's vectors
# at p < T do not depend on what follows).

# %%
long = corpus_windows(model, n_seq=N_SEQ, seq_len=2 * SEQ_LEN)
lengths = length_study(model, long, lengths=(32, 64, 128), edge_k=4, progress=False)
print(lengths.by_length("matched_last").round(4))
lengths.plot()
