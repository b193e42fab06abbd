"""Smoke runs and checks of the experiments translation, numbers, digits, sampling and bert_mlm."""

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.experiments import _seq2seq, bert_mlm, digits, numbers, sampling, translation
from seqjax.experiments._config import config_from_dict
from seqjax.experiments._seq2seq import BOS, EOS, PAD
from tests.experiments._devices import assert_trained_on_all_devices
from tests.experiments._learning import assert_loss_dropped

RESULTS = Path(__file__).resolve().parents[2] / "seqjax" / "experiments" / "results"

# ----------------------------------------------------------------------------- translation


def test_preprocess_matches_d2l():
    assert _seq2seq.preprocess("He's calm.") == "he's calm ."
    assert _seq2seq.preprocess("Va\u202f!") == "va !"
    assert _seq2seq.preprocess("Wait, what?") == "wait , what ?"


def test_d2l_bleu():
    assert translation.d2l_bleu("je suis chez moi .", "je suis chez moi .") == 1.0
    # p1 = 3/4, p2 = 1/3, no brevity penalty: (3/4)^(1/2) (1/3)^(1/4)
    assert translation.d2l_bleu("il est riche .", "il est calme .") == pytest.approx(
        0.75 ** 0.5 * (1 / 3) ** 0.25)
    # brevity penalty exp(1 - 4/2); p1 = 1, p2 = 1
    assert translation.d2l_bleu("il est", "il est calme .") == pytest.approx(math.exp(-1.0))
    assert translation.d2l_bleu("", "va !") == 0.0
    assert translation.d2l_bleu("!", "va !") == 0.0  # no bigram to match


def test_corpus_bleu_multi_reference():
    pytest.importorskip("sacrebleu")
    hyps = ["il est calme .", "va !"]
    refs = [["il est calme ."], ["allez !", "va !"]]
    assert translation.corpus_bleu(hyps, refs) == pytest.approx(100.0)
    one = translation.corpus_bleu(hyps, [["il est calme ."], ["allez !"]])
    two = translation.corpus_bleu(hyps, [["il est calme ."], ["allez !", "va !"]])
    assert one < two


def test_encode_pairs_teacher_forcing_layout():
    src_tok = _seq2seq.build_tokenizer(["go .", "i lost ."])
    tgt_tok = _seq2seq.build_tokenizer(["va !", "j'ai perdu ."])
    a = _seq2seq.encode_pairs(["i lost ."], ["j'ai perdu ."], src_tok, tgt_tok, src_len=4,
                              tgt_len=4)
    y = tgt_tok.encode("j'ai perdu .")
    assert a["src"][0].tolist() == src_tok.encode("i lost .") + [PAD]
    assert a["src_lengths"].tolist() == [3]
    assert a["tgt_in"][0].tolist() == [BOS, *y, PAD]
    assert a["tgt_out"][0].tolist() == [*y, EOS, PAD]
    assert a["tgt_mask"][0].tolist() == [True] * 4 + [False]


def test_split_by_source_keeps_every_translation_of_a_sentence_together():
    src = ["a .", "a .", "b .", "c .", "d .", "e .", "e ."]
    train, test = translation.split_by_source(src, 0.4)
    assert train.isdisjoint(test) and train | test == set(src) and len(test) == 2


def test_attention_map_rows_are_distributions():
    model = _seq2seq.make_model("bahdanau", 9, 11, embed_dim=4, hidden_size=4)
    src, tgt = jnp.ones((1, 3), jnp.int32), jnp.ones((1, 4), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), src, tgt)["params"]
    alpha = _seq2seq.attention_map(model, params, [4, 5, 6], [7, 8])
    assert alpha.shape == (3, 3)
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-5)


def test_translation_smoke(tmp_path):
    pytest.importorskip("sacrebleu")
    argv = ["--smoke", "--steps=40", "--workdir", str(tmp_path)]  # 40 steps: see it learn
    s = translation.main(argv)
    assert_trained_on_all_devices(tmp_path, tmp_path / "transformer_seed0")
    assert [r["arch"] for r in s["runs"]] == ["transformer"]
    r = s["runs"][0]
    assert 0.0 <= r["bleu"] <= 100.0 and len(r["probes"]) == 4
    assert all(0.0 <= p["bleu"] <= 1.0 for p in r["probes"])
    assert (tmp_path / "translation.json").exists()
    assert (tmp_path / "translation_bleu_vs_length.png").exists()
    # It learned: the training loss falls from 5.03 (step 1) to 3.85 (mean of steps 36-40).
    assert_loss_dropped(tmp_path / "transformer_seed0", rel=0.1, tail=5)
    # A rerun restores the finished model (no training) and reports the logged run.
    again = translation.main(argv)["runs"][0]
    assert again["bleu"] == r["bleu"] and again["probes"] == r["probes"]
    assert again["final_train_loss"] == pytest.approx(r["final_train_loss"])
    assert 0.0 < again["train_s"] <= r["train_s"]


# ----------------------------------------------------------------------------- numbers


def test_split_numbers_is_stratified_by_digit_count():
    nums = list(range(1000))
    train, test = numbers.split_numbers(nums, 0.2)
    assert set(train).isdisjoint(test) and len(train) + len(test) == 1000
    assert {len(str(nums[i])) for i in test} == {1, 2, 3}
    assert sum(len(str(nums[i])) == 3 for i in test) == 180


def test_detokenize_and_prompt():
    assert numbers.detokenize("quatre - vingt - dix - sept") == "quatre-vingt-dix-sept"
    assert numbers.detokenize("one thousand , two") == "one thousand, two"
    assert numbers._english("97") == "ninety-seven"


def test_numbers_quickstart_preset_is_short_and_verbose():
    from seqjax.cli import build_config

    cfg = build_config(numbers, "numbers", ["--preset", "quickstart"])
    assert cfg.steps < numbers.Config().steps and cfg.progress
    assert cfg.archs == ("bahdanau",) and cfg.workdir == "workdirs/numbers_quickstart"


def test_numbers_smoke_and_cli_generate(tmp_path):
    s = numbers.main(["--smoke", "--steps=40", "--workdir", str(tmp_path)])  # 40: it learns
    assert_trained_on_all_devices(tmp_path, tmp_path / "bahdanau_seed0")
    r = s["runs"][0]
    # It learned: the training loss falls from 3.40 (step 1) to 2.62 (mean of steps 36-40).
    assert_loss_dropped(tmp_path / "bahdanau_seed0", rel=0.12, tail=5)
    assert r["arch"] == "bahdanau" and 0.0 <= r["exact_match"] <= 1.0
    assert set(r["by_digits"]) == {1, 2, 3}
    assert (tmp_path / "numbers_attention_97_bahdanau.png").exists()
    assert (tmp_path / "numbers_exact_match.png").exists()
    saved = json.loads((tmp_path / "experiment.json").read_text())
    assert saved["config"]["model"]["hidden_size"] == 8  # the network's group, --model.*
    cfg = config_from_dict(numbers.Config, saved["config"])
    assert cfg.model == numbers.ModelOptions(embed_dim=8, hidden_size=8, dropout_rate=0.0)
    assert numbers.generate(cfg, "97").startswith("ninety-seven -> ")


# ----------------------------------------------------------------------------- digits


def test_row_transformer_sees_one_token_per_row():
    from seqjax.models.vit import patchify

    x = np.random.default_rng(0).random((2, 8, 8)).astype(np.float32)
    tokens = patchify(jnp.asarray(digits._inputs(x, "row_image")), 1)
    np.testing.assert_array_equal(np.asarray(tokens), x)


def test_digits_smoke(tmp_path):
    # 100 steps at a learning rate of 0.01, not the preset's 3 at 3e-3: enough to see the
    # 8-unit LSTM learn (at 3e-3 its loss falls 2% in 120 steps)
    s = digits.main(["--smoke", "--steps=100", "--learning_rate=0.01", "--workdir", str(tmp_path)])
    assert_trained_on_all_devices(tmp_path, tmp_path / "lstm_seed0")
    # It learned: the loss falls from ln 10 = 2.30 (step 1) to a mean over steps 96-100 of
    # 1.87 (LSTM) and 1.67 (ViT); batches of 16 images are noisy, hence the mean.
    for model in ("lstm", "vit"):
        assert_loss_dropped(tmp_path / f"{model}_seed0", rel=0.08, tail=5)
    assert [r["model"] for r in s["runs"]] == ["lstm", "vit"]
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in s["runs"])
    assert s["svm_accuracy"] > 0.9  # scikit-learn's gallery SVM on the same split
    # The smoke keeps the full run's split (20% held out, seed 0): the SVM's figure is the
    # results file's.
    svm = f"{100 * s['svm_accuracy']:.2f}"
    published = (RESULTS / "digits.md").read_text(encoding="utf-8")
    assert f"| SVC(gamma=0.001) (scikit-learn gallery) | 64 px | – | {svm} |" in published
    assert (tmp_path / "digits_accuracy.png").exists()


# ----------------------------------------------------------------------------- sampling


def test_distinct_n_and_strategy_names():
    assert sampling.distinct_n(["to be or not to be"], 1) == pytest.approx(4 / 6)
    assert sampling.parse_strategy("topp0.9") == {"top_p": 0.9}
    assert sampling.parse_strategy("beam4") == {"beam_size": 4}
    with pytest.raises(ValueError, match="unknown strategy"):
        sampling.parse_strategy("nucleus")


def test_sampling_smoke_scores_agree_with_the_decoder(tmp_path):
    s = sampling.main(["--smoke", "--workdir", str(tmp_path)])
    assert s["model"]["source"] == "trained here (fallback)"
    assert [r["strategy"] for r in s["rows"]] == ["human", "greedy", "beam2", "topp0.9"]
    assert (tmp_path / "sampling.png").exists() and (tmp_path / "samples.md").exists()
    # sampling trains nothing of its own; its figures show Bishop's Fig. 12.17 even for the
    # smoke's 4-step LM (fixed seed): the maximising strategies' text is more likely under
    # the model than the human continuation (log-lik/char: beam2 -3.82, greedy -3.92, human
    # -4.18 on Tiny Shakespeare; -3.91, -3.89, -4.15 on the test fixture). (Distinct-n is
    # not asserted: 12 new characters make one or two words.)
    rows = {r["strategy"]: r for r in s["rows"]}
    for strategy in ("greedy", "beam2"):
        assert rows[strategy]["loglik_per_char"] > rows["human"]["loglik_per_char"] + 0.1, rows
    # The teacher-forced scorer reproduces greedy search's own log-probabilities.
    from seqjax.experiments._text import load_model

    model, params, tok, lm_cfg = load_model(str(tmp_path / "char_lm"))
    dec = sampling.decoder_for(model, lm_cfg)
    prompt = jnp.asarray([tok.encode("ROMEO:\n"), tok.encode("KING:\nI")], jnp.int32)
    from seqjax.decoding import greedy_search

    out = greedy_search(dec, params, prompt, max_new_tokens=12)
    logp = sampling.score(dec, params, prompt, out.tokens)
    np.testing.assert_allclose(np.asarray(logp.sum(1)), np.asarray(out.log_probs), rtol=1e-4)


# ----------------------------------------------------------------------------- bert_mlm


def test_macro_f1_matches_scikit_learn():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    gold, pred = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    assert bert_mlm.macro_f1(pred, gold) == pytest.approx(f1_score(gold, pred, average="macro"))


def test_bert_inputs_drop_the_label_punctuation():
    tok = bert_mlm.WordTokenizer.from_texts(["are you ok", "i see"], pattern=r"\S+",
                                            special_tokens=bert_mlm.SPECIALS)
    a = bert_mlm.encode(["are you ok ?", "i see ."], tok, 5)
    assert a["tokens"][0].tolist() == [tok.cls_id, *tok.encode("are you ok"), 0]
    assert a["label"].tolist() == [1, 0] and a["lengths"].tolist() == [4, 3]


def test_bert_mlm_smoke(tmp_path):
    # 100 pre-training steps, not the preset's 3: enough to see the losses fall
    s = bert_mlm.main(["--smoke", "--pretrain_steps=100", "--workdir", str(tmp_path)])
    assert_trained_on_all_devices(tmp_path, tmp_path / "pretrain")
    # It learned: the MLM loss falls from ln V = 4.22 (step 1) to 3.64, the mean over the
    # masked tokens of steps 81-100 (a batch holds 0-8 of them: single steps are noise); the
    # decoder form's causal-LM loss from 4.21 to 3.39 (the same mean, ~32 tokens a batch).
    assert_loss_dropped(tmp_path / "pretrain", rel=0.06, tail=20, weight="tokens")
    assert_loss_dropped(tmp_path / "lm_pretrain", rel=0.1, tail=20, weight="tokens")
    # Two seeds: the pre-trained encoder is reused after a run that donated its buffers.
    assert sorted((r["init"], r["seed"]) for r in s["runs"]) == [
        ("pretrained", 0), ("pretrained", 1), ("scratch", 0), ("scratch", 1)]
    assert 0.0 <= s["mlm_eval"]["eval/accuracy"] <= 1.0
    assert all(d["input"].split()[1] == "<mask>" for d in s["fill_in"])
    assert (tmp_path / "bert_mlm.png").exists()
    # The decoder form (on by default) ran beside it: a causal LM pre-trained with the same
    # options, its last-token classifier fine-tuned from it and from scratch.
    dec = s["decoder"]
    assert sorted((r["model"], r["init"], r["seed"]) for r in dec["runs"]) == [
        ("gpt", "pretrained", 0), ("gpt", "pretrained", 1),
        ("gpt", "scratch", 0), ("gpt", "scratch", 1)]
    assert all(r["model"] == "bert" for r in s["runs"])
    assert 0.0 <= dec["lm_eval"]["eval/accuracy"] <= 1.0
    assert np.isfinite(dec["lm_eval"]["eval/loss"])
    # The classifier's tree is the LM's plus class_head ([D, 3] + [3], D = 16 in smoke).
    assert dec["params_classifier"] == dec["params_lm"] + 16 * 3 + 3
    assert "causal LM, last token (decoder)" in s["table_md"]
