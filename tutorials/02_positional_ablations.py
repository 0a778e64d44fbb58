# %% [markdown]
# # Removing positional information
#
# Does positional information drive homogenization (claim C3 of Yusupov et al. 2025,
# arXiv 2508.17126)? Ablate it and measure homogenization and next-token loss on the same
# sequences. Offline, on tiny random models (a learned-absolute GPT-2 and a rotary Llama);
# use `load_model("smollm2-135m-instruct")` for a real pretrained model.

# %%
import matplotlib

matplotlib.use("Agg")

import torch

from homoglens import (
    ablated_positions,
    corpus_windows,
    load_model,
    position_ablation_hooks,
    position_ablation_study,
)
from homoglens.testing import tiny_model_folder

gpt2 = load_model(tiny_model_folder("gpt2"))
llama = load_model(tiny_model_folder("llama"))

# %% [markdown]
# ## Hooks, ready for TransformerLens
# Learned absolute positions are changed at `hook_pos_embed`; rotary ones in every block.

# %%
print([name for name, _ in position_ablation_hooks(gpt2, "zero")])
print([name for name, _ in position_ablation_hooks(llama, "zero", layers=[0])])

# %% [markdown]
# ## The context manager restores the model, whatever happens inside

# %%
tokens = corpus_windows(llama, n_seq=1, seq_len=16).tokens
with torch.no_grad():
    base = llama(tokens)
    with ablated_positions(llama, "zero"):
        no_rotation = llama(tokens)
    with ablated_positions(llama, "shift", shift=7):  # rotary: only i - j matters
        shifted = llama(tokens)
print("zero changes logits by", float((no_rotation - base).abs().max()))
print("a global shift changes them by", float((shifted - base).abs().max()))

# %% [markdown]
# ## A paired study with bootstrap intervals

# %%
windows = corpus_windows(gpt2, n_seq=12, seq_len=48)
study = position_ablation_study(gpt2, windows, n_boot=200, progress=False)
print(study.loss_table().round(4))
print(
    study.layer_table()[
        ["mode", "layer", "mean_pairwise", "diff_vs_none", "diff_ci_low", "diff_ci_high"]
    ].round(4)
)
fig = study.plot()
