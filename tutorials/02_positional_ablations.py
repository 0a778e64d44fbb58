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
# # Removing positional information
#
# Does positional information drive homogenization (claim C3 of Yusupov et al. 2025,
# arXiv 2508.17126)? Ablate it and measure homogenization and next-token loss on the same
# sequences, on a learned-absolute (GPT-2 architecture) and a rotary model.

# %%
# Pick the models. Offline defaults: the shipped homoglens/tiny-learned (GPT-2 architecture,
# learned absolute positions, trained on Austen) and the embedded SmolLM2-135M (Llama, rotary on
# every channel). With the Hugging Face Hub: "gpt2" and "EleutherAI/pythia-70m" (partial rotary);
# positional ablations work on the 20 families of the architecture table (rotary, learned,
# ALiBi), e.g. "Qwen/Qwen2.5-0.5B", "google/gemma-2-2b", "facebook/opt-125m" (learned, offset 2),
# "bigscience/bloom-560m" (ALiBi), "microsoft/phi-2" (partial rotary).
LEARNED_MODEL = "homoglens/tiny-learned"
ROTARY_MODEL = "smollm2-135m-instruct"

# %%
import torch

from homoglens import (
    ablated_positions,
    architecture_of,
    corpus_windows,
    load_model,
    position_ablation_hooks,
    position_ablation_study,
)

learned = load_model(LEARNED_MODEL)
rotary = load_model(ROTARY_MODEL)
print(architecture_of(learned))
print(architecture_of(rotary))

# %% [markdown]
# ## Hooks, ready for TransformerLens
# Learned absolute positions are changed at `hook_pos_embed`; rotary ones in every block.

# %%
print([name for name, _ in position_ablation_hooks(learned, "zero")])
print([name for name, _ in position_ablation_hooks(rotary, "zero", layers=[0, 1])])

# %% [markdown]
# ## The context manager restores the model, whatever happens inside
# Under rotary attention only the distance i - j matters, so a global shift changes nothing
# (up to float error), while removing the rotation changes everything.

# %%
tokens = corpus_windows(rotary, n_seq=1, seq_len=32).tokens
with torch.no_grad():
    base = rotary(tokens)
    with ablated_positions(rotary, "zero"):
        no_rotation = rotary(tokens)
    with ablated_positions(rotary, "shift", shift=7):
        shifted = rotary(tokens)
print("zero changes logits by", float((no_rotation - base).abs().max()))
print("a global shift changes them by", float((shifted - base).abs().max()))

# %% [markdown]
# ## A paired study with bootstrap intervals
# Each mode runs on the same sequences; differences to the intact model ("none") get 95 %
# bootstrap intervals over sequences.

# %%
windows = corpus_windows(learned, n_seq=32, seq_len=96, bos="never")
study = position_ablation_study(learned, windows, n_boot=200, progress=False)
print(study.loss_table().round(4))
print(
    study.layer_table()[
        ["mode", "layer", "mean_pairwise", "diff_vs_none", "diff_ci_low", "diff_ci_high"]
    ].round(4)
)
study.plot()

# %% [markdown]
# The same on the rotary model, fewer sequences (it is 30 layers deep):

# %%
rot_study = position_ablation_study(
    rotary, corpus_windows(rotary, n_seq=8, seq_len=64), n_boot=200, progress=False
)
print(rot_study.loss_table().round(3))
