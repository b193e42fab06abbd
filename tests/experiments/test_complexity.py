"""The complexity / path-length table: FLOP counting, critical paths, dependency graphs."""

import jax
import numpy as np
import pytest

from seqjax.experiments import complexity

CFG = complexity.Config(model=complexity.ModelOptions(width=8, num_heads=2, d_state=4))


def test_rnn_flops_count_every_scan_step():
    """Elman layer: 2Td² (input projection) + 2Td² (recurrent matmuls) + 2Td (bias, sum) —
    XLA counts the scan body once; the correction multiplies it by the length."""
    d = CFG.model.width
    f5, f12 = (complexity.measure("rnn", CFG, t)["flops"] for t in (5, 12))
    assert f12 - f5 == 7 * (4 * d * d + 2 * d)  # exactly one step's matmuls and adds per step
    assert abs(f5 - 5 * (4 * d * d + 2 * d)) <= 4  # (+ the loop's own bookkeeping)


def test_attention_flops_have_the_quadratic_term():
    """Causal MHA: FLOPs = a T² + b T + c with a ≥ 4d (QKᵀ and AV, 2T²d each; Bishop
    §12.1.8) plus softmax terms per head, and b ≈ 8d² (the four projections)."""
    d, h = CFG.model.width, CFG.model.num_heads
    ts = np.array([16, 32, 64])
    f = [complexity.measure("attention", CFG, int(t))["flops"] for t in ts]
    a, b, _ = np.polyfit(ts, f, 2)
    assert 4 * d <= a <= 4 * d + 10 * h, a
    assert abs(b - 8 * d * d) < 0.1 * 8 * d * d, b


@pytest.mark.parametrize("name, dilation", [("cnn", 1), ("cnn_dilated", 3)])
def test_cnn_flops_are_2_k_d2_per_tap_xla_counts(name, dilation):
    """One causal conv layer: 2d² per tap that lands inside the sequence (XLA does not count
    the taps on the left zero padding: Σ_j max(T − j·r, 0) of the kT) + d per step (bias);
    the slides' and Vaswani's O(k N d²)."""
    d, k = CFG.model.width, CFG.model.kernel_size
    for t in (5, 16):
        taps = sum(max(t - j * dilation, 0) for j in range(k))
        assert complexity.measure(name, CFG, t)["flops"] == 2 * d * d * taps + d * t


def test_sequential_ops_grow_with_t_only_for_the_rnn():
    s = {
        m: [complexity.measure(m, CFG, t)["sequential_ops"] for t in (8, 16, 32)]
        for m in complexity.MODELS
    }
    d1, d2 = s["rnn"][1] - s["rnn"][0], s["rnn"][2] - s["rnn"][1]
    assert d2 == 2 * d1 > 0  # T × (the step's critical path)
    assert s["attention"][0] == s["attention"][2]
    assert s["cnn"][0] == s["cnn"][2] == s["cnn_dilated"][0] == s["cnn_dilated"][2]
    assert s["linear_attention"][0] == s["linear_attention"][2]
    assert s["ssm"][0] < s["ssm"][2] < s["ssm"][0] + 3 * 8  # associative scan: ~log T


def test_max_path_lengths():
    for t in (1, 4, 9):
        assert (
            complexity.max_path_length(complexity.position_graph("rnn", t, "parallel"), t) == t + 1
        )
        assert (
            complexity.max_path_length(complexity.position_graph("attention", t, "recurrent"), t)
            == 1
        )
        for m in ("linear_attention", "ssm"):
            assert complexity.max_path_length(complexity.position_graph(m, t, "parallel"), t) == 1
            assert (
                complexity.max_path_length(complexity.position_graph(m, t, "recurrent"), t) == t + 1
            )
    with pytest.raises(ValueError, match="`form` must be"):
        complexity.position_graph("rnn", 3, "tree")


@pytest.mark.parametrize("k", [2, 3, 4])
def test_cnn_stack_path_lengths(k):
    """O(N/k) stacked, O(log_k N) dilated: the stack that covers T has ⌈(T−1)/(k−1)⌉ or
    ⌈log_k T⌉ layers, and the layer-by-layer search equals the dictionary search."""
    for t in (1, 2, 5, 9, 10, 28):
        plain = max(1, -(-(t - 1) // (k - 1)))
        dilated = max(1, int(np.ceil(np.log(t) / np.log(k) - 1e-9)))
        assert complexity.conv_dilations("cnn", t, k) == [1] * plain
        assert complexity.conv_dilations("cnn_dilated", t, k) == [k**i for i in range(dilated)]
        for name, depth in (("cnn", plain), ("cnn_dilated", dilated)):
            assert complexity.conv_path_length(name, t, k) == depth
            for form in ("parallel", "recurrent"):
                graph = complexity.position_graph(name, t, form, kernel_size=k)
                assert complexity.max_path_length(graph, t) == depth
                np.testing.assert_array_equal(
                    complexity.reachability(graph, t), np.tril(np.ones((t, t), bool))
                )
    with pytest.raises(ValueError, match="`kernel_size` must be >= 2"):
        complexity.conv_dilations("cnn", 4, 1)
    with pytest.raises(ValueError, match="`name` must be one of"):
        complexity.conv_dilations("rnn", 4, 3)


def test_a_kernel_of_one_is_refused_at_the_door_only_with_cnn_rows():
    """``--model.kernel_size=1`` exits 2 (a ``ConfigError`` naming it) when a CNN row is
    measured, and is accepted without one, as before the option moved into the group."""
    from seqjax.experiments._config import ConfigError
    from seqjax.experiments._runner import build_config

    with pytest.raises(ConfigError, match=r"--model.kernel_size must be >= 2 for the CNN rows"):
        build_config(complexity, "complexity", ["--model.kernel_size=1"], resume=False)
    cfg = build_config(complexity, "complexity", ["--model.kernel_size=1", "--models=rnn"],
                       resume=False)
    assert cfg.model.kernel_size == 1
    with pytest.raises(ConfigError, match=r"--fit_last must be in \[2, len\(lengths\) = 7\]"):
        build_config(complexity, "complexity", ["--fit_last=8"], resume=False)


@pytest.mark.parametrize(
    "name, t", [(m, 5) for m in complexity.MODELS] + [("cnn", 10), ("cnn_dilated", 10)]
)
def test_graph_reachability_is_the_layers_jacobian_pattern(name, t):
    """y_i depends on x_j exactly when j ≤ i, in the graphs and in the library's layers (for
    the CNNs, the stack of CausalConv1D layers that covers T)."""
    module, fn = complexity.stack(name, CFG, t)
    x = jax.random.normal(jax.random.PRNGKey(0), (1, t, CFG.model.width))
    params = module.init(jax.random.PRNGKey(1), x)
    jac = jax.jit(jax.jacrev(lambda x: fn(params, x)))(x)[0, :, :, 0, :, :]  # [T, d, T, d]
    measured = np.abs(np.asarray(jac)).max(axis=(1, 3)) > 1e-7
    np.testing.assert_array_equal(measured, np.tril(np.ones((t, t), bool)))
    for form in ("parallel", "recurrent"):
        graph = complexity.position_graph(name, t, form, kernel_size=CFG.model.kernel_size)
        np.testing.assert_array_equal(complexity.reachability(graph, t), measured)


def test_complexity_smoke(tmp_path):
    s = complexity.main(["--smoke", "--workdir", str(tmp_path)])
    assert abs(s["fits"]["rnn"]["flops"] - 1.0) < 1e-3
    assert abs(s["fits"]["rnn"]["sequential_ops"] - 1.0) < 0.1
    assert (tmp_path / "complexity.md").exists() and (tmp_path / "complexity.png").exists()
    assert abs(s["fits"]["cnn"]["flops"] - 1.0) < 0.05
    assert s["fits"]["cnn"]["sequential_ops"] == pytest.approx(0.0, abs=1e-9)
    rows = {(r["model"], r["T"]): r for r in s["rows"]}
    assert rows[("cnn", 64)]["path_parallel"] == 32  # ⌈63 / 2⌉ layers of k = 3
    assert rows[("cnn_dilated", 64)]["path_parallel"] == 4  # ⌈log_3 64⌉
