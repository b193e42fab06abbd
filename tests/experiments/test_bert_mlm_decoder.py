"""bert_mlm's decoder form: the causal-LM loss and the table (its smoke run, beside the encoder
form's, is tests/experiments/test_group_b.py::test_bert_mlm_smoke)."""

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.experiments import bert_mlm
from seqjax.experiments.reports import bert_mlm as report
from seqjax.models import TransformerLM


def test_lm_loss_is_next_word_cross_entropy_over_real_tokens():
    """Position t predicts token t + 1 of ``<cls> w_1 … w_n``; padding is never a target
    (numpy reference; padded ids changed to anything leave the loss unchanged)."""
    cfg = bert_mlm.Config(model=bert_mlm.ModelOptions(num_layers=1, num_heads=2, embed_dim=16,
                                                      mlp_dim=32, dropout_rate=0.0))
    model = TransformerLM(bert_mlm._lm_config(cfg, vocab=11, length=6))
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 11, (3, 6)).astype(np.int32)
    lengths = np.array([6, 3, 2], np.int32)
    params = model.init(jax.random.PRNGKey(0), jnp.asarray(tokens))["params"]
    batch = {"tokens": jnp.asarray(tokens), "lengths": jnp.asarray(lengths)}
    loss, m = bert_mlm._lm_batch(model, params, batch, jax.random.PRNGKey(1), False)
    logits = np.asarray(model.apply({"params": params}, batch["tokens"], batch["lengths"]))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = [-logp[b, t, tokens[b, t + 1]] for b in range(3) for t in range(lengths[b] - 1)]
    np.testing.assert_allclose(loss, np.mean(nll), rtol=1e-5)
    assert float(m["tokens"]) == len(nll) == 5 + 2 + 1
    garbage = tokens.copy()
    garbage[1, 3:], garbage[2, 2:] = 7, 9
    loss2, _ = bert_mlm._lm_batch(
        model, params, {**batch, "tokens": jnp.asarray(garbage)}, jax.random.PRNGKey(1), False
    )
    np.testing.assert_allclose(loss2, loss, rtol=1e-6)


def test_table_puts_both_forms_side_by_side():
    runs = [
        {"model": m, "n_labels": n, "seed": s, "init": i, "accuracy": 0.5, "macro_f1": 0.4}
        for m in ("gpt", "bert")
        for n in (100, 10)
        for s in (0, 1)
        for i in ("pretrained", "scratch")
    ]
    lines = report.results_table(runs, 0.8).splitlines()
    assert len(lines) == 2 + 8 + 1
    assert [ln.split(" | ")[:2] for ln in lines[2:6]] == [
        ["| 10", report.FORMS["bert"]],
        ["| 10", report.FORMS["bert"]],
        ["| 10", report.FORMS["gpt"]],
        ["| 10", report.FORMS["gpt"]],
    ]
    assert lines[-1].startswith("| – | majority class | – | 80.000")
