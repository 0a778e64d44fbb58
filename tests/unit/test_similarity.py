"""positional_similarity / PositionalSimilarity: a float64 brute-force oracle written without
homoglens' sums, null models where no position is special, invariances of the centrings, the
Hugging Face oracle of space="final_norm", TransformerLens' own normalisation hooks for
space="ln_input", padding, batching, backends, merging, the profile's baseline identity, and bad
input."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import BACKENDS, hook_count, state_hash
from homoglens import (
    IncompatibleResultsError,
    InvalidInputError,
    NonFiniteActivationError,
    PositionalSimilarity,
    TokenBatch,
    corpus_windows,
    cosine_homogenization,
    homogenization_profile,
    load_model,
    positional_similarity,
)
from homoglens.testing import tiny_model_folder


# ------------------------------------------------------------------ the oracle
def brute_force(x: torch.Tensor, first: int, k: int) -> dict[str, torch.Tensor]:
    """Every quantity of SCIENCE.md "Position-resolved similarity", in float64, with loops over
    windows and pairs: no homoglens code, no coefficient matrices."""
    x = x[:, first:].double()
    n, t, _ = x.shape
    norm = x.norm(dim=-1, keepdim=True)
    u = torch.where(norm > 0, x / norm.clamp_min(1e-300), torch.zeros_like(x))
    m = sum(u[s] @ u[s].T for s in range(n)) / n
    c = torch.zeros(t, t, dtype=torch.float64)
    for s in range(n):
        for r in range(n):
            if s != r:
                c += u[s] @ u[r].T
    c /= n * (n - 1)
    w = m - c
    first_g, mid, last_g = list(range(k)), list(range(k, t - k)), list(range(t - k, t))
    others = (m.sum(1) - m.diagonal()) / (t - 1)

    def matched(edge: list[int]) -> float:
        ref = {}
        for d in range(1, len(mid)):
            ref[d] = sum(w[a, a + d] for a in mid if a + d in mid) / (len(mid) - d)
        pairs = [(i, j) for i in edge for j in mid if abs(i - j) <= len(mid) - 1]
        return float(sum(w[i, j] - ref[abs(i - j)] for i, j in pairs) / len(pairs))

    off = ~torch.eye(t, dtype=torch.bool)
    return {
        "M": m,
        "C": c,
        "W": w,
        "SP": c.diagonal().clone(),
        "to_first": m[:, 0].clone(),
        "lag": torch.stack([m.diagonal(-d).mean() for d in range(t)]),
        "naive_first": others[first_g].mean() - others[mid].mean(),
        "naive_last": others[last_g].mean() - others[mid].mean(),
        "matched_first": torch.tensor(matched(first_g), dtype=torch.float64),
        "matched_last": torch.tensor(matched(last_g), dtype=torch.float64),
        "homogenization": w[off].mean(),
    }


def with_se(table):
    """The edge table with the standard error its 95 % Wald interval implies."""
    return table.assign(se=(table["ci_high"] - table["ci_low"]) / (2 * 1.959964))


def ar1(n: int, t: int, d: int, *, rho: float = 0.9, offset: float = 0.5, seed: int = 0):
    """A stationary AR(1) sequence of vectors per window plus a constant offset: similarity
    falls with distance, and no position is special."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, t, d, generator=gen, dtype=torch.float64)
    x = torch.empty_like(noise)
    x[:, 0] = noise[:, 0]
    for i in range(1, t):
        x[:, i] = rho * x[:, i - 1] + math.sqrt(1 - rho * rho) * noise[:, i]
    return x + offset


def _check_against(result: PositionalSimilarity, x: torch.Tensor, li: int, atol: float) -> None:
    ref = brute_force(x, result.first_position, result.edge_k)
    for name in ("M", "C", "W"):
        assert torch.allclose(getattr(result, name)[li], ref[name], atol=atol, rtol=0), name
    for name in ("SP", "to_first", "lag"):
        assert torch.allclose(getattr(result, name)[li], ref[name], atol=atol, rtol=0), name
    table = result.edge_excess(block=1)
    rows = table[table["layer"] == result.layers[li]].set_index("edge")
    for edge in ("first", "last"):
        assert abs(rows.loc[edge, "naive"] - float(ref[f"naive_{edge}"])) < atol
        assert abs(rows.loc[edge, "matched"] - float(ref[f"matched_{edge}"])) < atol
    assert abs(float(result.homogenization[li]) - float(ref["homogenization"])) < atol


@pytest.mark.parametrize("first", [0, 1])
def test_brute_force_float64_with_padding(first: int) -> None:
    """Left-padded float64 activations with junk in the pads, two layers: every quantity and
    both edge statistics equal the brute force to 1e-10."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, 21, 6, generator=gen, dtype=torch.float64)
    x[:, :, 3] *= 0.0  # a zero vector: it counts with u = 0
    padded = torch.full((2, 9, 25, 6), 1e6, dtype=torch.float64)
    padded[:, :, 4:] = x
    mask = torch.zeros(9, 25, dtype=torch.long)
    mask[:, 4:] = 1
    result = PositionalSimilarity.from_activations(
        padded, mask, exclude_first=bool(first), edge_k=3, batch_size=4
    )
    assert result.layers == (0, 1) and result.n_pos == 21 - first
    for li in range(2):
        _check_against(result, x[li], li, 1e-10)
    for stat in ("naive_first", "naive_last", "matched_first", "matched_last", "homogenization"):
        ref = brute_force(x[1], first, 3)[stat]
        assert abs(float(result.per_window(stat)[:, 1].mean()) - float(ref)) < 1e-10, stat


def test_pseudo_values_average_to_the_statistic_and_track_its_noise() -> None:
    """Second-pass pseudo-values: their mean is every statistic exactly (1e-10), SP edges too;
    over 30 independent AR(1) corpora their standard error matches the spread of the estimate
    (within 30 %; measured 0.94)."""
    x = ar1(40, 24, 8, seed=3)
    res = PositionalSimilarity.from_activations(x, edge_k=4, pseudo_values=True)
    ref = brute_force(x, 0, 4)
    for stat in ("matched_first", "matched_last", "homogenization", "naive_first"):
        assert abs(float(res.per_window(stat).mean()) - float(ref[stat])) < 1e-10, stat
    sp = ref["SP"]
    for edge, where in (("first", slice(0, 4)), ("last", slice(20, 24))):
        want = sp[where].mean() - sp[4:20].mean()
        assert abs(float(res.per_window(f"sp_{edge}").mean()) - float(want)) < 1e-10
    values, ses = [], []
    for seed in range(30):
        r = PositionalSimilarity.from_activations(
            ar1(60, 24, 8, seed=100 + seed), edge_k=4, pseudo_values=True
        )
        values.append(float(r.per_window("matched_last").mean()))
        ses.append(float(r.per_window("matched_last").std() / math.sqrt(60)))
        assert PositionalSimilarity.merge(r.sel(0)).has_pseudo_values  # one part keeps them
    spread = torch.tensor(values).std().item()
    assert 0.7 < (sum(ses) / len(ses)) / spread < 1.3


def test_merge_of_uneven_splits_equals_one_pass() -> None:
    x = ar1(23, 20, 5, seed=4)
    whole = PositionalSimilarity.from_activations(x, edge_k=3, pseudo_values=False)
    parts = [
        PositionalSimilarity.from_activations(x[a:b], edge_k=3, pseudo_values=False)
        for a, b in ((0, 3), (3, 4), (4, 23))
    ]
    merged = PositionalSimilarity.merge(*parts)
    for name in ("M", "C", "W", "SP", "lag", "homogenization"):
        assert torch.allclose(getattr(merged, name), getattr(whole, name), atol=1e-10, rtol=0)
    for stat in ("matched_first", "naive_last"):
        assert torch.allclose(merged.per_window(stat), whole.per_window(stat), atol=1e-10)
    with pytest.raises(IncompatibleResultsError, match="edge_k"):
        PositionalSimilarity.merge(whole, PositionalSimilarity.from_activations(x, edge_k=4))
    centred = PositionalSimilarity.from_activations(x, edge_k=3, centre="global")
    with pytest.raises(IncompatibleResultsError, match="corpus mean"):
        PositionalSimilarity.merge(centred, centred)
    with_pseudo = PositionalSimilarity.from_activations(x, edge_k=3, pseudo_values=True)
    with pytest.warns(UserWarning, match="drops"):
        dropped = PositionalSimilarity.merge(with_pseudo, parts[0])
    assert not dropped.has_pseudo_values


def test_baseline_identity_with_the_profile() -> None:
    """mean_{i,j} C[i, j] is the profile's anisotropy baseline on equal-length windows."""
    x = ar1(15, 18, 7, seed=5)
    for first in (0, 1):
        sim = PositionalSimilarity.from_activations(x, edge_k=3, exclude_first=bool(first))
        prof = cosine_homogenization(x, exclude_first=bool(first))
        assert abs(float(sim.baseline[0]) - float(prof.baseline[0])) < 1e-10
        assert abs(float(sim.mean_pairwise[0]) - float(prof.mean_pairwise[0])) < 1e-10
        assert torch.allclose(sim.to_others[0], prof.to_others[0, first:], atol=1e-10)


# ------------------------------------------------------------------ null models
def test_ar1_null_naive_reads_an_edge_effect_matched_does_not() -> None:
    """The stationary AR(1) of the issue (N=400, T=128, d=128, rho=0.9, +0.5): the naive edge
    excess is below -0.02 at both edges, the distance-matched one within 3 SE of 0."""
    res = PositionalSimilarity.from_activations(ar1(400, 128, 128), edge_k=8)
    table = with_se(res.edge_excess()).set_index("edge")
    for edge in ("first", "last"):
        assert table.loc[edge, "naive"] < -0.02, table
        assert abs(table.loc[edge, "matched"]) < 3 * table.loc[edge, "se"], table


def test_shared_positional_component_is_removed_by_position_centring() -> None:
    """Large early rows shared by every window (like W_pos or a BOS) bias the matched first
    edge; centre="position" removes them (within 3 SE of 0)."""
    x = ar1(300, 64, 32, seed=6)
    gen = torch.Generator().manual_seed(7)
    rows = torch.randn(64, 32, generator=gen, dtype=torch.float64)
    shared = rows * (6.0 * torch.exp(-torch.arange(64.0, dtype=torch.float64) / 4))[:, None]
    y = x + shared
    raw = PositionalSimilarity.from_activations(y, edge_k=8).edge_excess().set_index("edge")
    centred = PositionalSimilarity.from_activations(y, edge_k=8, centre="position")
    table = with_se(centred.edge_excess()).set_index("edge")
    assert abs(table.loc["first", "matched"]) < 3 * table.loc["first", "se"], table
    assert abs(raw.loc["first", "naive"]) > 3 * abs(table.loc["first", "matched"])


def test_a_real_last_edge_effect_is_found_and_stays_at_its_edge() -> None:
    """The last 8 tokens pulled toward their window's mean (x <- x + 0.3 (xbar - x)): the
    matched last-edge excess is >= +0.03, the first edge stays within 3 SE of 0."""
    x = ar1(400, 128, 128, seed=8)
    y = x.clone()
    y[:, -8:] += 0.3 * (x.mean(1, keepdim=True) - x[:, -8:])
    table = with_se(PositionalSimilarity.from_activations(y, edge_k=8).edge_excess())
    table = table.set_index("edge")
    assert table.loc["last", "matched"] >= 0.03, table
    assert abs(table.loc["first", "matched"]) < 3 * table.loc["first", "se"], table


# ------------------------------------------------------------------ invariances
def test_centrings_remove_what_they_promise() -> None:
    """A constant vector added to every token leaves centre="global" unchanged; a vector per
    position added to every window leaves centre="position" unchanged (1e-6), with and
    without standardisation."""
    x = ar1(30, 20, 12, seed=9)
    gen = torch.Generator().manual_seed(10)
    const = torch.randn(12, generator=gen, dtype=torch.float64)
    per_pos = torch.randn(20, 12, generator=gen, dtype=torch.float64) * 3
    for standardize in (False, True):
        for centre, shift in (("global", const), ("position", per_pos)):
            a = PositionalSimilarity.from_activations(
                x, edge_k=3, centre=centre, standardize=standardize
            )
            b = PositionalSimilarity.from_activations(
                x + shift, edge_k=3, centre=centre, standardize=standardize
            )
            for name in ("M", "C", "SP"):
                assert torch.allclose(getattr(a, name), getattr(b, name), atol=1e-6), name
            assert torch.allclose(
                a.per_window("matched_last"), b.per_window("matched_last"), atol=1e-6
            )


def test_drop_dims_zeroes_the_massive_dimensions_and_nothing_else(tmp_path) -> None:
    """Issue 38 (standard corrections): drop_dims=k zeroes, per layer, the k dimensions of
    largest mean square before the cosines. Planted massive dimensions (a large shared value
    on two dimensions, as in Sun et al. 2024) push every cosine near 1; dropping them gives the
    brute force of the vectors with those dimensions zeroed by hand (float64), and the result
    saves, loads and selects with its dropped dimensions; merging such results is refused (the
    dimensions are each part's own), and a k that zeroes everything is a typed error."""
    x = ar1(24, 20, 12, seed=21)
    massive = x.clone()
    massive[..., [2, 7]] += torch.tensor([40.0, -25.0], dtype=torch.float64)
    k = 3
    plain = PositionalSimilarity.from_activations(massive, edge_k=k)
    assert float(plain.homogenization.mean()) > 0.8 or float(plain.M.mean()) > 0.8
    dropped = PositionalSimilarity.from_activations(massive, edge_k=k, drop_dims=2)
    assert dropped.dropped_dims is not None and dropped.dropped_dims.tolist() == [[2, 7]]
    by_hand = massive.clone()
    by_hand[..., [2, 7]] = 0
    want = brute_force(by_hand, 0, k)
    assert torch.allclose(dropped.M[0], want["M"], atol=1e-12)
    assert torch.allclose(dropped.C[0], want["C"], atol=1e-12)
    for stat in ("homogenization", "matched_first", "matched_last", "sp_first", "sp_last"):
        ref = PositionalSimilarity.from_activations(by_hand, edge_k=k)
        assert torch.allclose(dropped.per_window(stat), ref.per_window(stat), atol=1e-12), stat
    dropped.save(tmp_path / "d")
    back = PositionalSimilarity.load(tmp_path / "d")
    assert back.dropped_dims is not None and back.dropped_dims.tolist() == [[2, 7]]
    two = PositionalSimilarity.from_activations(torch.stack([massive, x]), edge_k=k, drop_dims=1)
    assert two.dropped_dims is not None and two.sel(1).dropped_dims is not None
    assert two.sel(1).dropped_dims.tolist() == two.dropped_dims[1:].tolist()
    with pytest.raises(IncompatibleResultsError, match="drop_dims"):
        PositionalSimilarity.merge(dropped, dropped)
    with pytest.raises(InvalidInputError, match="drop_dims=12"):
        PositionalSimilarity.from_activations(massive, edge_k=k, drop_dims=12)


def test_global_centring_leaves_position_0_and_massive_tokens_out_of_the_mean() -> None:
    x = ar1(20, 16, 10, seed=11)
    spiked = x.clone()
    spiked[:, 5, 2] = 1e4  # a massive activation at position 5
    spiked[:, 0] += 50.0  # a very different first token
    a = PositionalSimilarity.from_activations(spiked, edge_k=3, centre="global")
    assert a.n_massive == (20,)
    mean = torch.cat([x[:, 1:5], x[:, 6:]], 1).reshape(-1, 10).mean(0)
    u = spiked - mean
    u = u / u.norm(dim=-1, keepdim=True)
    ref = (u[:, 7] * u[:, 9]).sum(-1).mean()
    assert abs(float(a.M[0, 7, 9]) - float(ref)) < 1e-10


# ------------------------------------------------------------------ on models
def _windows(model, n: int = 10, seq_len: int = 24, bos: str = "never") -> TokenBatch:
    return corpus_windows(model, n_seq=n, seq_len=seq_len, bos=bos)


@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_model_path_equals_the_brute_force_on_hf_hidden_states(arch: str, get_model) -> None:
    """positional_similarity on the model == the oracle on Hugging Face's hidden states."""
    model = get_model(arch, "bridge")
    batch = _windows(model)
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_folder(arch))).eval()
    with torch.no_grad():
        hidden = hf(batch.tokens, output_hidden_states=True).hidden_states
    result = positional_similarity(model, batch, layers=[0, 1], edge_k=4, progress=False)
    for li in range(2):
        _check_against(result, hidden[li], li, 1e-5)


def test_padding_side_and_batch_size_change_nothing(get_model) -> None:
    model = get_model("gpt2", "bridge")
    batch = _windows(model, n=7)
    plain = positional_similarity(model, batch, edge_k=4, batch_size=7, progress=False)
    tokens = torch.full((7, 30), 50256)
    mask = torch.zeros(7, 30, dtype=torch.long)
    for i in range(7):
        start = i % 6  # left pads of several widths, right pads after
        tokens[i, start : start + 24] = batch.tokens[i]
        mask[i, start : start + 24] = 1
    padded = positional_similarity(
        model, tokens, attention_mask=mask, edge_k=4, batch_size=3, progress=False
    )
    for name in ("M", "C", "SP", "lag"):
        assert torch.allclose(getattr(plain, name), getattr(padded, name), atol=1e-6), name
    assert torch.allclose(plain.window_within, padded.window_within, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_replayed_passes_equal_passes_that_run_the_model(backend: str, get_model, monkeypatch):
    """With the vectors kept (they fit the budget) the model runs once, not three times, and
    every number is the same as with three model passes (budget 0)."""
    import homoglens.similarity.measure as similarity

    model = get_model("llama", backend)
    batch = _windows(model, n=7)
    calls: list[str] = []
    real_stream = similarity.stream

    def counted(*args, **kwargs):
        calls.append(kwargs["desc"])
        return real_stream(*args, **kwargs)

    monkeypatch.setattr(similarity, "stream", counted)
    options = {"edge_k": 4, "centre": "position", "pseudo_values": True, "batch_size": 3}
    kept = positional_similarity(model, batch, progress=False, **options)
    assert calls == ["similarity (centring)"]
    monkeypatch.setattr(similarity, "ACTIVATION_CACHE_BYTES", 0)
    rerun = positional_similarity(model, batch, progress=False, **options)
    assert len(calls) == 4
    for name in ("M", "C", "W", "SP", "lag", "window_within", "window_cross"):
        a, b = getattr(kept, name), getattr(rerun, name)
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), name
    assert hook_count(model) == 0


@pytest.mark.skipif(len(BACKENDS) < 2, reason="needs HookedTransformer (TransformerLens 3.x)")
@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_backends_agree(arch: str, get_model) -> None:
    results = []
    for backend in BACKENDS:
        model = get_model(arch, backend)
        results.append(positional_similarity(model, _windows(model), edge_k=4, progress=False))
    for name in ("M", "C", "W", "SP"):
        assert torch.allclose(getattr(results[0], name), getattr(results[1], name), atol=1e-5)


def test_model_baseline_matches_the_profile(get_model) -> None:
    model = get_model("llama", "bridge")
    batch = _windows(model, n=9, bos="always")
    sim = positional_similarity(model, batch, edge_k=4, progress=False)  # auto: BOS excluded
    assert sim.first_position == 1
    prof = homogenization_profile(model, batch, exclude_first=True, progress=False)
    assert torch.allclose(sim.baseline, prof.baseline, atol=1e-6)
    assert torch.allclose(sim.mean_pairwise, prof.mean_pairwise, atol=1e-6)


def test_sp_is_one_at_a_bos(backend: str, get_model) -> None:
    """Every window's BOS sees only itself, so its vector is the same in every window."""
    model = get_model("gpt2", backend)
    batch = _windows(model, bos="always")
    sim = positional_similarity(model, batch, exclude_first=False, edge_k=4, progress=False)
    assert sim.first_position == 0
    assert torch.allclose(sim.SP[:, 0], torch.ones(len(sim.layers), dtype=torch.float64), atol=1e-6)


def _with_random_final_norm(arch: str, tmp_path: Path) -> Path:
    """A copy of the tiny model whose final norm has non-trivial weights (and bias), so that a
    wrong hook point (before the affine map) would show."""
    folder = tiny_model_folder(arch)
    hf = AutoModelForCausalLM.from_pretrained(str(folder))
    norm = hf.transformer.ln_f if arch == "gpt2" else hf.model.norm
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(norm.weight.shape, generator=gen) * 2 + 0.1)
        if getattr(norm, "bias", None) is not None:
            norm.bias.copy_(torch.randn(norm.bias.shape, generator=gen))
    out = tmp_path / f"{arch}-norm"
    hf.save_pretrained(str(out))
    for name in folder.iterdir():
        if name.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            (out / name.name).write_bytes(name.read_bytes())
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_final_norm_space_equals_hf_last_hidden_state(arch: str, backend: str, tmp_path) -> None:
    folder = _with_random_final_norm(arch, tmp_path)
    model = load_model(folder, backend=backend)
    hf = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    batch = _windows(model)
    with torch.no_grad():
        hidden = hf(batch.tokens, output_hidden_states=True).hidden_states
    sim = positional_similarity(model, batch, space="final_norm", edge_k=4, progress=False)
    assert sim.layers == (model.cfg.n_layers,) and sim.space == "final_norm"
    _check_against(sim, hidden[-1], 0, 1e-5)
    resid = positional_similarity(
        model, batch, layers=[model.cfg.n_layers], edge_k=4, progress=False
    )
    assert (resid.M - sim.M).abs().max() > 1e-3  # the final norm matters here


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_ln_input_space_equals_transformerlens_normalised_input(
    arch: str, backend: str, get_model
) -> None:
    """space="ln_input" == cosines of TransformerLens' own ``ln1.hook_normalized`` (and
    ``ln_final.hook_normalized`` for the last entry), a different hook point."""
    model = get_model(arch, backend)
    batch = _windows(model)
    n_layers = model.cfg.n_layers
    names = [f"blocks.{layer}.ln1.hook_normalized" for layer in range(n_layers)]
    names.append("ln_final.hook_normalized")
    with torch.inference_mode():
        _, cache = model.run_with_cache(batch.tokens, names_filter=names)
    sim = positional_similarity(model, batch, space="ln_input", edge_k=4, progress=False)
    for li, name in enumerate(names):
        _check_against(sim, cache[name], li, 1e-5)
    normalised = torch.stack([cache[name] for name in names])  # [layer batch pos d_model]
    for centre in ("global", "position"):  # the corpus mean is taken over normalised vectors
        got = positional_similarity(
            model, batch, space="ln_input", centre=centre, edge_k=4, progress=False
        )
        want = PositionalSimilarity.from_activations(normalised, centre=centre, edge_k=4)
        assert torch.allclose(got.M, want.M, atol=1e-5) and torch.allclose(got.C, want.C, atol=1e-5)


# ------------------------------------------------------------------ results and errors
def test_save_load_tables_and_plot(tmp_path, get_model) -> None:
    import matplotlib

    matplotlib.use("Agg")
    model = get_model("gpt2", "bridge")
    sim = positional_similarity(
        model, _windows(model), edge_k=4, pseudo_values=True, progress=False
    )
    back = PositionalSimilarity.load(sim.save(tmp_path / "sim"))
    for name in ("M", "C", "window_cross", "window_same_position"):
        assert torch.equal(getattr(back, name), getattr(sim, name))
    assert back.provenance == sim.provenance and back.edge_k == 4
    tidy = sim.to_pandas()
    warnings.simplefilter("ignore", UserWarning)  # 10 windows: fewer than 4 blocks of 16
    assert set(tidy["metric"]) >= {"SP", "to_first", "lag", "homogenization", "baseline"}
    assert list(sim.sp_excess().columns)[:5] == ["layer", "edge", "sp_edge", "sp_middle", "excess"]
    edge = sim.edge_excess()
    assert list(edge.columns) == [
        "layer", "edge", "naive", "matched", "se", "ci_low", "ci_high", "n_sequences"
    ]  # fmt: skip
    with pytest.warns(UserWarning, match="edge_k=4"):
        other = sim.edge_excess(k=3)
    assert other["ci_low"].isna().all() and other["matched"].notna().all()
    assert sim.plot(layers=[0, 2]) is not None
    assert sim.sel([2]).layers == (2,)


def test_bad_input_is_refused_and_leaves_nothing_behind(get_model) -> None:
    model = get_model("gpt2", "bridge")
    before = state_hash(model)
    windows = _windows(model)
    mixed = ["It is a truth universally acknowledged", "Emma"]
    cases = [
        (dict(data=mixed), "equal length"),
        (dict(data=windows, centre="median"), "centre"),
        (dict(data=windows, space="attn"), "space"),
        (dict(data=windows, edge_k=12), "edge_k"),
        (dict(data=windows, standardize=True), "centre="),
        (dict(data=windows, space="final_norm", layers=[0]), "final_norm"),
        (dict(data=windows, layers=[7]), "out of range"),
        (dict(data=windows, massive_threshold=0.5), "massive_threshold"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidInputError, match=message):
            positional_similarity(model, progress=False, **kwargs)
        assert hook_count(model) == 0, kwargs
    assert state_hash(model) == before
    x = torch.randn(4, 20, 8)
    mask = torch.ones(4, 20, dtype=torch.long)
    mask[0, :3] = 0
    with pytest.raises(InvalidInputError, match="equal length"):
        PositionalSimilarity.from_activations(x, mask)
    with pytest.raises(InvalidInputError):
        PositionalSimilarity.from_activations(x, torch.ones(4, 19, dtype=torch.long))
    bad = x.clone()
    bad[1, 4, 0] = float("nan")
    with pytest.raises(NonFiniteActivationError):
        PositionalSimilarity.from_activations(bad, edge_k=4)
    with pytest.raises(InvalidInputError, match="float tensor"):
        PositionalSimilarity.from_activations(torch.ones(4, 20, dtype=torch.long))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PositionalSimilarity.from_activations(x, edge_k=4)  # no warning on good input
