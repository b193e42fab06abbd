"""BERT encoder, heads and MLM masking (Bishop §12.3.3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models.bert import Bert, BertConfig, bert_block, mlm_mask
from seqjax.train.losses import token_cross_entropy
from seqjax.utils import count_params
from tests.models.helpers import accuracy, fit, np_init

V = 20
CFG = BertConfig(vocab_size=V, num_layers=1, embed_dim=16, block_size=12, num_classes=3, num_tags=4,
                 block=bert_block(2, mlp_dim=32, dropout_rate=0.0))


def _shapes(cfg):
    return jax.eval_shape(Bert(cfg).init, jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))


def test_parameter_counts():
    """bert-base's encoder has 109,482,240 parameters (Hugging Face ``BertModel``);
    BERT-Large is "approximately 340 million" (Bishop Ex. 12.16)."""
    base = _shapes(BertConfig())["params"]
    mlm = count_params({k: base[k] for k in ("mlm_dense", "mlm_norm", "mlm_bias")})
    assert count_params(base) - mlm == 109_482_240
    assert mlm == 768 * 768 + 768 + 2 * 768 + 30522  # tied: no |V|×D output matrix
    large = count_params(_shapes(BertConfig(num_layers=24, embed_dim=1024, mlm_head=False,
                                            block=bert_block(16, mlp_dim=4096)))["params"])
    assert abs(large - 340e6) / 340e6 < 0.02


def test_config_refuses_a_block_without_norm_epsilon():
    """The embedding and MLM-head LayerNorms take ``ε`` from the block, so a block that
    leaves it to the norms' default (``None``) is refused at construction, by name."""
    from seqjax.nn import BlockConfig

    msg = r"`block.norm_epsilon` of BertConfig must be a number > 0.*; got None"
    with pytest.raises(ValueError, match=msg):
        BertConfig(block=bert_block(2, mlp_dim=32, norm_epsilon=None))
    with pytest.raises(ValueError, match=msg):
        BertConfig(block=BlockConfig.encoder(2, mlp_dim=32))
    with pytest.raises(ValueError, match=msg):
        CFG.replace(block=CFG.block.replace(norm_epsilon=None))
    assert CFG.replace(block=CFG.block.replace(norm_epsilon=1e-6)).block.norm_epsilon == 1e-6


def test_heads_shapes_padding_and_tied_mlm():
    model = Bert(CFG)
    x = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 7)), jnp.int32)
    v = np_init(model, x, scale=None)

    @jax.jit
    def run(v, x, repadded, lengths):
        return model.apply(v, x, lengths), model.apply(v, repadded, lengths)

    out, out2 = run(v, x, x.at[1, 4:].set(5), jnp.array([7, 4]))
    assert out["mlm_logits"].shape == (2, 7, V) and out["class_logits"].shape == (2, 3)
    assert out["tag_logits"].shape == (2, 7, 4) and out["pooled"].shape == (2, 16)
    # Padding is invisible to the real tokens (bidirectional attention masks padded keys).
    np.testing.assert_allclose(out["hidden"][1, :4], out2["hidden"][1, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["class_logits"], out2["class_logits"], rtol=1e-5, atol=1e-6)
    # The MLM output matrix is the token embedding E (tied): only a bias of its own.
    assert sorted(v["params"]) == ["classifier", "embed_norm", "encoder", "mlm_bias",
                                   "mlm_dense", "mlm_norm", "pooler", "pos_embed", "tagger",
                                   "token_embed", "type_embed"]


def test_mlm_mask_rates_on_1e5_tokens():
    """15% selected; of those 80% <mask>, 10% random, 10% unchanged (Bishop §12.3.3)."""
    vocab, mask_id, n = 1000, 1000, 100_000
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, vocab, (100, n // 100)), jnp.int32)
    maskable = jnp.ones_like(tokens, bool).at[:, 0].set(False)  # e.g. the <class> token
    inputs, selected = mlm_mask(jax.random.PRNGKey(0), tokens, vocab_size=vocab,
                                mask_id=mask_id, maskable_BxT=maskable)
    inputs, selected, tokens = map(np.asarray, (inputs, selected, tokens))
    assert not selected[:, 0].any()
    assert (inputs[~selected] == tokens[~selected]).all()
    n_sel = selected.sum()
    se = lambda p, m: 4 * np.sqrt(p * (1 - p) / m)  # noqa: E731
    assert abs(n_sel / maskable.sum() - 0.15) < se(0.15, int(maskable.sum()))
    masked = (inputs == mask_id)[selected].mean()
    random = ((inputs != mask_id) & (inputs != tokens))[selected].mean()
    kept = (inputs == tokens)[selected].mean()
    assert abs(masked - 0.8) < se(0.8, n_sel)
    assert abs(random - 0.1 * (1 - 1 / vocab)) < se(0.1, n_sel)  # a random draw may hit x
    assert abs(kept - 0.1 * (1 + 1 / vocab)) < se(0.1, n_sel)
    again = mlm_mask(jax.random.PRNGKey(0), jnp.asarray(tokens), vocab_size=vocab,
                     mask_id=mask_id, maskable_BxT=maskable)
    np.testing.assert_array_equal(again[0], inputs)
    with pytest.raises(ValueError, match="mask_rate"):
        mlm_mask(jax.random.PRNGKey(0), tokens, vocab_size=vocab, mask_id=0, mask_rate=0.95)


def test_bert_learns_masked_tokens_and_classes():
    """Rows repeat one token: MLM recovers masked copies from context, and the class head
    reads the token's parity from <class>. Both need bidirectional attention."""
    cls_id, mask_id, n_batches = 0, 1, 150
    cfg = BertConfig(vocab_size=12, num_layers=1, embed_dim=32, block_size=8, num_classes=2,
                     block=bert_block(2, mlp_dim=64, dropout_rate=0.0, norm="pre",
                                      norm_epsilon=1e-6))
    model = Bert(cfg)
    tok = np.random.default_rng(0).integers(2, 12, (n_batches * 32, 1))
    x = np.concatenate([np.full_like(tok, cls_id), np.repeat(tok, 7, -1)], -1)
    # BERT's corruption (here with numpy; mlm_mask is tested above): 30% of the copies,
    # 80% of them -> <mask>, 10% -> a random token, 10% unchanged.
    rng = np.random.default_rng(1)
    selected = (rng.random(x.shape) < 0.3) & (np.arange(8) > 0)
    u = rng.random(x.shape)
    corrupt = np.where(u < 0.8, mask_id, np.where(u < 0.9, rng.integers(0, 12, x.shape), x))
    inputs, selected = jnp.asarray(np.where(selected, corrupt, x), jnp.int32), jnp.asarray(selected)
    batches = tuple(a.reshape(n_batches, 32, *a.shape[1:]) for a in
                    (inputs, selected, jnp.asarray(x, jnp.int32),
                     jnp.asarray(tok[:, 0] % 2, jnp.int32)))
    v = np_init(model, batches[0][0], scale=None)

    def loss(p, batch):
        xin, sel, target, y = batch
        out = model.apply(p, xin)
        n_sel = jnp.maximum(sel.sum(), 1)
        mlm = jnp.sum(token_cross_entropy(out["mlm_logits"], target, sel)) / n_sel
        hit = jnp.sum((out["mlm_logits"].argmax(-1) == target) & sel) / n_sel
        cls_loss = token_cross_entropy(out["class_logits"][:, None], y[:, None]).mean()
        return mlm + cls_loss, (hit, accuracy(out["class_logits"], y))

    _, (_, (acc_mlm, acc_cls)) = fit(loss, v, batches, lr=3e-3, has_aux=True)
    assert float(acc_mlm[-10:].mean()) > 0.97  # on batches before training on them
    assert float(acc_cls[-10:].mean()) > 0.97
