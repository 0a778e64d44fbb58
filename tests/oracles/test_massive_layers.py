"""Oracle: Sun et al. 2024's layer-wise statistics (arXiv 2402.17762, Fig. 2; ``main_llm.py
--exp2``), ``MassiveActivations.layer_top`` / ``layer_median``, against a hand computation over
plain Hugging Face hidden states in float64: per sequence, the three largest |x| and the median
|x| over every real token and dimension of the hidden state, averaged over sequences. Plus a
null (a random tiny model: no massive activation), a planted outlier (found, at its layer, dim
and token), an invariant (order of the sequences, batch size and extra padding change nothing)
and the ``plot(kind="layers")`` figure on both backends."""

from __future__ import annotations

import pytest
import torch

from helpers import hf_model, hf_module, hf_run
from homoglens import find_massive_sites, massive_activations
from homoglens.core.errors import InvalidInputError
from homoglens.run.data import to_token_batch

ARCH = "llama"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a longer sentence with several more tokens in it.",
    "Short one.",
    "Massive activations sit at the first token and at delimiters, says Sun.",
]


def _hand_statistics(tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``([layer 3] top |x|, [layer] median |x|)``, means over sequences, from HF hidden states
    in float64 (entry 0 = embeddings, l = output of decoder layer l; the last entry read from
    the last block's output, since HF's last hidden state is after the final norm)."""
    hf = hf_model(ARCH)
    n_layers = hf.config.num_hidden_layers
    last = {}

    def keep(x: torch.Tensor) -> torch.Tensor:
        last["x"] = x.clone()
        return x

    block = hf_module(hf, ARCH, n_layers - 1, "block")
    out = hf_run(hf, tokens, [(block, "output", keep)], attention_mask=mask,
                 output_hidden_states=True)  # fmt: skip
    hidden = [*out.hidden_states[:n_layers], last["x"]]
    tops, medians = [], []
    for b in range(tokens.shape[0]):
        real = mask[b].bool()
        a = [h[b][real].double().abs().flatten() for h in hidden]
        tops.append(torch.stack([x.sort(descending=True).values[:3] for x in a]))
        medians.append(torch.stack([x.sort().values[(x.numel() - 1) // 2] for x in a]))
    return torch.stack(tops).mean(0), torch.stack(medians).mean(0)


@pytest.fixture(scope="module")
def measured(get_model):
    model = get_model(ARCH, "bridge")
    batch = to_token_batch(model, TEXTS)
    acts = massive_activations(model, batch, median="layer", batch_size=3, progress=False)
    return model, batch, acts


def test_layer_top_and_median_match_hf_hidden_states(measured) -> None:
    _, batch, acts = measured
    top, median = _hand_statistics(batch.tokens, batch.attention_mask)
    assert int(batch.attention_mask.sum(1).min()) < batch.tokens.shape[1]  # padding is there
    assert acts.layer_top is not None and acts.layer_median is not None
    assert acts.layer_top.shape == top.shape == (len(acts.layers), 3)
    torch.testing.assert_close(acts.layer_top.double(), top, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(acts.layer_median.double(), median, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(acts.layer_ratio.double(), top[:, 0] / median, rtol=1e-6, atol=0)
    table = acts.layer_table()
    assert list(table.columns) == ["layer", "top1", "top2", "top3", "median", "ratio"]
    assert table["top1"].tolist() == pytest.approx(top[:, 0].tolist(), rel=1e-6)


def test_null_no_massive_activation_in_a_random_model(measured) -> None:
    model, batch, acts = measured
    assert float(acts.layer_ratio.max()) < 100  # Sun et al.'s massive: ~1000 x the median
    assert float(acts.dim_counts.sum()) == 0
    assert find_massive_sites(model, batch, progress=False) is None


def test_planted_outlier_is_found_at_its_layer_dim_and_token(get_model) -> None:
    model = get_model(ARCH, "bridge")

    def plant(resid, hook):
        resid = resid.clone()
        resid[:, 0, 5] = 4000.0  # the first token, dim 5, from decoder layer 1 on (residual)
        return resid

    model.add_hook("blocks.0.hook_resid_post", plant)
    try:
        with pytest.warns(UserWarning, match="did not attach"):  # the planted hook is foreign
            acts = massive_activations(model, TEXTS, median="layer", progress=False)
            sites = find_massive_sites(model, TEXTS, progress=False)
    finally:
        model.reset_hooks()
    assert acts.layer_top[0, 0] < 100 and acts.layer_top[1, 0] == pytest.approx(4000.0)
    assert float(acts.layer_ratio[1]) > 1000 and float(acts.layer_ratio[0]) < 100
    assert acts.top_dims(1).loc[1, "dims"] == [5]
    assert sites == (1, (5,), (0,))


def test_invariant_to_order_batch_size_and_padding(measured, get_model) -> None:
    model, batch, acts = measured
    order = torch.tensor([2, 0, 3, 1])
    wide = torch.nn.functional.pad(batch.tokens[order], (0, 5), value=0)
    wide_mask = torch.nn.functional.pad(batch.attention_mask[order], (0, 5), value=0)
    other = massive_activations(
        model, wide, attention_mask=wide_mask, median="layer", batch_size=1, progress=False
    )
    torch.testing.assert_close(other.layer_top, acts.layer_top, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(other.layer_median, acts.layer_median, rtol=1e-6, atol=1e-6)
    top = acts.layer_top
    assert bool((top[:, 0] >= top[:, 1]).all() and (top[:, 1] >= top[:, 2]).all())
    assert bool((top[:, 2] >= acts.layer_median).all())


@pytest.mark.parametrize("backend", ["matplotlib", "plotly"])
def test_plot_layers_on_both_backends(measured, backend) -> None:
    pytest.importorskip("plotly") if backend == "plotly" else None
    _, _, acts = measured
    layers = acts.plot(kind="layers", backend=backend)
    default = acts.plot(backend=backend)
    if backend == "matplotlib":
        import matplotlib.pyplot as plt

        (ax,) = layers.axes
        assert ax.get_yscale() == "log" and len(ax.get_lines()) == 4
        assert len(default.axes) >= 2  # the default heatmap, unchanged (position 0 panel)
        plt.close(layers), plt.close(default)
    else:
        assert layers.layout.yaxis.type == "log" and len(layers.data) == 4
        assert [trace.name for trace in layers.data] == ["top 1", "top 2", "top 3", "median"]
        assert all(trace.type == "heatmap" for trace in default.data)


def test_plot_bad_kind_raises(measured) -> None:
    _, _, acts = measured
    for kind in ("layer", "", 3):
        with pytest.raises(InvalidInputError, match="kind="):
            acts.plot(kind=kind)  # type: ignore[arg-type]
