"""Decoding: greedy, sampling (temperature, top-k, top-p), beam search (Bishop §12.3.2)."""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.decoding import (
    FunctionalDecoder,
    beam_search,
    generate,
    greedy_search,
    lower_sample,
    process_logits,
    sample,
)

# ----------------------------------------------------------------------------- toy models

# Bishop Ex. 12.15 with a consistent table: p(AA)=.30, p(AB)=.25, p(BA)=.05, p(BB)=.40.
# Tokens: A=0, B=1, <start>=2 (never emitted).
JOINT = np.array([[0.30, 0.25], [0.05, 0.40]])


def _bishop_init(params, prompt, lengths, max_len):
    return jnp.full((prompt.shape[0],), -1, jnp.int32)  # y1 once emitted, -1 before


def _bishop_step(params, y1, tok):
    first = jnp.log(jnp.array([*JOINT.sum(1), 1e-30]))
    cond = jnp.log(jnp.concatenate([JOINT / JOINT.sum(1, keepdims=True),
                                    jnp.full((2, 1), 1e-30)], axis=1))
    logits = jnp.where((y1 < 0)[:, None], first[None], cond[jnp.clip(tok, 0, 1)])
    return logits, jnp.where(y1 < 0, tok, y1)


BISHOP = FunctionalDecoder(_bishop_init, _bishop_step)


def _bigram_init(params, prompt, lengths, max_len):
    return lengths - 1  # position of the token fed next


def _bigram_step(params, pos, tok):
    """logits = W[previous token] + U[position]: a position-dependent bigram model."""
    w, u = params
    return w[tok] + u[pos], pos + 1


BIGRAM = FunctionalDecoder(_bigram_init, _bigram_step)


def _bigram_params(vocab, seed=0, scale=2.0):
    rng = np.random.default_rng(seed)  # numpy: no eager jax.random compilations
    return (jnp.asarray(scale * rng.standard_normal((vocab, vocab)), jnp.float32),
            jnp.asarray(scale * rng.standard_normal((16, vocab)), jnp.float32))


def _seq_logprob(params, prompt_last, seq, pos0=0):
    w, u = (np.asarray(a, np.float64) for a in params)
    total, prev = 0.0, prompt_last
    for i, tok in enumerate(seq):
        logits = w[prev] + u[pos0 + i]
        logits = logits - logits.max()
        total += logits[tok] - np.log(np.exp(logits).sum())
        prev = tok
    return total


def _unigram_init(params, prompt, lengths, max_len):
    return jnp.zeros(prompt.shape[:1], jnp.int32)


def _unigram_step(params, state, tok):
    return jnp.broadcast_to(jnp.log(params), (tok.shape[0], params.shape[0])), state


UNIGRAM = FunctionalDecoder(_unigram_init, _unigram_step)
PROBS = jnp.array([0.4, 0.3, 0.15, 0.1, 0.05])


# ----------------------------------------------------------------------------- Bishop Ex. 12.15


def test_beam_search_finds_the_most_probable_sequence_where_greedy_does_not():
    start = jnp.array([[2]])
    greedy = greedy_search(BISHOP, None, start, max_new_tokens=2)
    assert greedy.tokens.tolist() == [[0, 0]]  # A then A: p(A)=.55 > p(B)=.45, then .30 > .25
    np.testing.assert_allclose(np.exp(greedy.log_probs), [0.30], rtol=1e-5)
    beam = beam_search(BISHOP, None, start, beam_size=2, max_new_tokens=2, length_penalty=0.0)
    assert beam.tokens[0, 0].tolist() == [1, 1]  # BB, the exact argmax of p(y1, y2)
    np.testing.assert_allclose(np.exp(beam.log_probs[0]), [0.40, 0.30], rtol=1e-5)
    full = beam_search(BISHOP, None, start, beam_size=4, max_new_tokens=2, length_penalty=0.0)
    order = sorted(itertools.product([0, 1], repeat=2), key=lambda s: -JOINT[s])
    assert [tuple(s) for s in full.tokens[0].tolist()] == order
    np.testing.assert_allclose(np.exp(full.log_probs[0]), sorted(JOINT.ravel())[::-1],
                               rtol=1e-5)


def test_sampling_matches_the_joint_distribution():
    out = sample(BISHOP, None, jnp.full((4000, 1), 2), key=jax.random.PRNGKey(0),
                 max_new_tokens=2)
    t = np.asarray(out.tokens)
    freq = np.array([[np.mean((t[:, 0] == a) & (t[:, 1] == b)) for b in (0, 1)] for a in (0, 1)])
    np.testing.assert_allclose(freq, JOINT, atol=0.03)
    np.testing.assert_allclose(out.log_probs, np.log(JOINT[t[:, 0], t[:, 1]]), rtol=1e-5)


# ----------------------------------------------------------------------------- equivalences


def test_beam1_equals_greedy_equals_topk1_equals_temperature_to_zero():
    params = _bigram_params(7)
    prompts = jnp.array([[3, 1, 4], [5, 0, 0], [2, 6, 0]])
    lengths = jnp.array([3, 1, 2])
    kw = dict(max_new_tokens=9, eos_id=6)
    g = greedy_search(BIGRAM, params, prompts, lengths, **kw)
    b = beam_search(BIGRAM, params, prompts, lengths, beam_size=1, length_penalty=0.0, **kw)
    k = sample(BIGRAM, params, prompts, lengths, key=jax.random.PRNGKey(1), top_k=1, **kw)
    t = sample(BIGRAM, params, prompts, lengths, key=jax.random.PRNGKey(2), temperature=1e-4,
               **kw)
    z = sample(BIGRAM, params, prompts, lengths, key=jax.random.PRNGKey(3), temperature=0.0,
               **kw)
    for other in (b.tokens[:, 0], k.tokens, t.tokens, z.tokens):
        np.testing.assert_array_equal(other, g.tokens)
    np.testing.assert_array_equal(b.lengths[:, 0], g.lengths)
    np.testing.assert_allclose(b.log_probs[:, 0], g.log_probs, rtol=1e-5)
    # Greedy's log-probability is that of its own sequence under the model.
    for r in range(3):
        seq = g.tokens[r, :int(g.lengths[r])].tolist()
        ref = _seq_logprob(params, int(prompts[r, lengths[r] - 1]), seq, int(lengths[r]) - 1)
        np.testing.assert_allclose(g.log_probs[r], ref, rtol=1e-5)


def test_eos_handling_and_padding():
    params = _bigram_params(5, seed=4)
    out = greedy_search(BIGRAM, params, jnp.array([[0], [1], [2], [3]]), max_new_tokens=8,
                        eos_id=4, pad_id=3)
    for row, n in zip(np.asarray(out.tokens), np.asarray(out.lengths)):
        eos = np.flatnonzero(row == 4)
        if eos.size:
            assert n == eos[0] + 1 and (row[n:] == 3).all()
        else:
            assert n == 8


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_with_all_hypotheses_is_exact(length_penalty):
    """A beam as wide as the hypothesis space returns the exact ranking (brute force)."""
    vocab, eos, n = 3, 2, 3
    params = _bigram_params(vocab, seed=7, scale=1.0)
    hyps = set()
    for seq in itertools.product(range(vocab), repeat=n):
        cut = seq.index(eos) + 1 if eos in seq else n
        hyps.add(seq[:cut])
    ranked = sorted(hyps, key=lambda s: -_seq_logprob(params, 1, s) / len(s) ** length_penalty)
    out = beam_search(BIGRAM, params, jnp.array([[1]]), beam_size=len(hyps), max_new_tokens=n,
                      eos_id=eos, pad_id=0, length_penalty=length_penalty)
    got = [tuple(out.tokens[0, i, :int(out.lengths[0, i])].tolist()) for i in range(len(hyps))]
    assert got == ranked
    ref_scores = [_seq_logprob(params, 1, s) / len(s) ** length_penalty for s in ranked]
    np.testing.assert_allclose(out.scores[0], ref_scores, rtol=1e-5)
    np.testing.assert_allclose(out.scores[0], out.log_probs[0] / out.lengths[0] ** length_penalty,
                               rtol=1e-6)


def test_beam_search_batch_rows_are_independent():
    """Rows of different prompt lengths do not interact: swapping them swaps the results."""
    params = _bigram_params(6, seed=2)
    kw = dict(beam_size=3, max_new_tokens=5, eos_id=5)
    a = beam_search(BIGRAM, params, jnp.array([[1, 2], [4, 0]]), jnp.array([2, 1]), **kw)
    b = beam_search(BIGRAM, params, jnp.array([[4, 3], [1, 2]]), jnp.array([1, 2]), **kw)
    np.testing.assert_array_equal(a.tokens[::-1], b.tokens)
    np.testing.assert_allclose(a.scores[::-1], b.scores, rtol=1e-6)


# ----------------------------------------------------------------------------- sampling


def test_sampling_follows_the_filtered_distribution_and_is_deterministic_per_key():
    """Temperature, top-k and top-p together: frequencies == softmax(process_logits(a))."""
    kw = dict(temperature=0.7, top_k=4, top_p=0.9, max_new_tokens=8)
    expected = np.asarray(jax.nn.softmax(process_logits(jnp.log(PROBS)[None], **{
        k: kw[k] for k in ("temperature", "top_k", "top_p")})))[0]
    assert expected[3:].sum() == 0.0 and expected[2] > 0  # top-k drops 0.05, top-p 0.1
    prompt = jnp.zeros((500, 1), jnp.int32)
    out = sample(UNIGRAM, PROBS, prompt, key=jax.random.PRNGKey(0), **kw)
    freq = np.bincount(np.asarray(out.tokens).ravel(), minlength=5) / out.tokens.size
    np.testing.assert_allclose(freq, expected, atol=0.02)
    again = sample(UNIGRAM, PROBS, prompt, key=jax.random.PRNGKey(0), **kw)
    other = sample(UNIGRAM, PROBS, prompt, key=jax.random.PRNGKey(1), **kw)
    np.testing.assert_array_equal(out.tokens, again.tokens)
    assert not np.array_equal(out.tokens, other.tokens)


def test_lower_sample_compiles_the_program_sample_then_runs(monkeypatch):
    """A program compiled ahead with lower_sample is the one sample runs: sample finds it
    and compiles nothing, and its output is the same."""
    from jax._src import compiler

    kw = dict(temperature=0.9, top_k=3, max_new_tokens=7)
    prompt = jnp.zeros((3, 2), jnp.int32)  # a shape no other test samples
    lower_sample(UNIGRAM, PROBS, prompt, key=jax.random.PRNGKey(4), **kw).compile()
    compiles = []
    real = compiler.compile_or_get_cached
    monkeypatch.setattr(compiler, "compile_or_get_cached",
                        lambda *a, **k: compiles.append(1) or real(*a, **k))
    out = sample(UNIGRAM, PROBS, prompt, key=jax.random.PRNGKey(4), **kw)
    monkeypatch.undo()
    assert compiles == []
    want = sample(UNIGRAM, PROBS, prompt, key=jax.random.PRNGKey(4), **kw)
    np.testing.assert_array_equal(out.tokens, want.tokens)
    with pytest.raises(ValueError, match="`temperature` must be >= 0"):
        lower_sample(UNIGRAM, PROBS, prompt, key=jax.random.PRNGKey(4), temperature=-1,
                     max_new_tokens=2)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
@pytest.mark.parametrize("top_k", [0, 2])
@pytest.mark.parametrize("top_p", [1.0, 0.3, 0.9])
def test_process_logits_matches_numpy(temperature, top_k, top_p):
    p = np.array([0.05, 0.4, 0.15, 0.3, 0.1])
    q = p ** (1 / temperature)
    q = q / q.sum()
    keep = np.ones(5, bool)
    if top_k:
        keep &= q >= np.sort(q)[::-1][top_k - 1]
    if top_p < 1.0:
        r = np.where(keep, q, 0) / np.where(keep, q, 0).sum()
        order = np.argsort(-r)
        before = np.cumsum(r[order]) - r[order]
        nucleus = np.zeros(5, bool)
        nucleus[order[before < top_p]] = True
        keep &= nucleus
    expected = np.where(keep, q, 0) / np.where(keep, q, 0).sum()
    got = jax.nn.softmax(process_logits(jnp.log(jnp.asarray(p))[None], temperature=temperature,
                                        top_k=top_k, top_p=top_p))[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_process_logits_reference():
    logits = jnp.log(jnp.array([[0.1, 0.4, 0.2, 0.3]]))
    np.testing.assert_allclose(process_logits(logits, temperature=2.0), logits / 2.0)
    k2 = np.asarray(process_logits(logits, top_k=2))
    assert np.isinf(k2[0, [0, 2]]).all() and np.isfinite(k2[0, [1, 3]]).all()
    p = np.asarray(process_logits(logits, top_p=0.5))  # .4 < .5 -> also keep .3
    assert np.isfinite(p[0, [1, 3]]).all() and np.isinf(p[0, [0, 2]]).all()
    p1 = np.asarray(process_logits(logits, top_p=0.3))  # the top token alone reaches .3
    assert np.isfinite(p1[0, 1]) and np.isinf(p1[0, [0, 2, 3]]).all()
    np.testing.assert_allclose(process_logits(logits, top_p=1.0), logits)


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    params = _bigram_params(4)
    with pytest.raises(ValueError, match="prompt"):
        greedy_search(BIGRAM, params, jnp.zeros((3,), jnp.int32), max_new_tokens=2)
    with pytest.raises(TypeError, match="prompt"):
        greedy_search(BIGRAM, params, jnp.zeros((1, 3)), max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_lengths"):
        greedy_search(BIGRAM, params, jnp.zeros((1, 3), jnp.int32), jnp.array([0]),
                      max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_search(BIGRAM, params, jnp.zeros((1, 3), jnp.int32), max_new_tokens=0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(BIGRAM, params, jnp.zeros((1, 3), jnp.int32), beam_size=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="temperature"):
        sample(BIGRAM, params, jnp.zeros((1, 1), jnp.int32), key=jax.random.PRNGKey(0),
               temperature=-1.0, max_new_tokens=2)
    with pytest.raises(ValueError, match="top_p"):
        sample(BIGRAM, params, jnp.zeros((1, 1), jnp.int32), key=jax.random.PRNGKey(0),
               top_p=0.0, max_new_tokens=2)
    with pytest.raises(ValueError, match="top_k"):
        sample(BIGRAM, params, jnp.zeros((1, 1), jnp.int32), key=jax.random.PRNGKey(0),
               top_k=-1, max_new_tokens=2)
    # Off is 0 for top_k (every token) and 1 for top_p; None, the old spelling, names them.
    for name, new in (("top_k", "top_k=0"), ("top_p", "top_p=1.0")):
        with pytest.raises(TypeError, match=re.escape(new)):
            sample(BIGRAM, params, jnp.zeros((1, 1), jnp.int32), key=jax.random.PRNGKey(0),
                   max_new_tokens=2, **{name: None})
        with pytest.raises(TypeError, match=re.escape(new)):
            process_logits(jnp.zeros((1, 4)), **{name: None})
    with pytest.raises(ValueError, match="key"):
        generate(BIGRAM, params, jnp.zeros((1, 1), jnp.int32), max_new_tokens=2, method="sample")
    with pytest.raises(ValueError, match="method"):
        generate(BIGRAM, params, jnp.zeros((1, 1), jnp.int32), max_new_tokens=2, method="x")


def test_generate_dispatches():
    # Same arguments as calls above: the compiled loops are reused.
    params = _bigram_params(5, seed=4)
    prompt = jnp.array([[0], [1], [2], [3]])
    kw = dict(max_new_tokens=8, eos_id=4, pad_id=3)
    np.testing.assert_array_equal(generate(BIGRAM, params, prompt, **kw).tokens,
                                  greedy_search(BIGRAM, params, prompt, **kw).tokens)
    b = generate(BISHOP, None, jnp.array([[2]]), max_new_tokens=2, method="beam", beam_size=2,
                 length_penalty=0.0)
    assert b.tokens[0, 0].tolist() == [1, 1]


def test_recompute_decoder_window_crops_as_nanogpt_and_refuses_a_bad_window():
    """window=W: each step sees the last W tokens (nanoGPT's crop), checked against a
    numpy reference on a causal toy model; W longer than the sequence = window 0."""
    from seqjax.decoding import greedy_search, recompute_decoder

    def logits_fn(params, x_BxL):  # causal: position t predicts (x_0 + ... + x_t) mod 7
        return jax.nn.one_hot(jnp.cumsum(x_BxL, axis=1) % 7, 7) * 5.0

    prompt = jnp.asarray([[1, 2, 3]])
    got = greedy_search(recompute_decoder(logits_fn, window=3), None, prompt,
                        max_new_tokens=6).tokens[0].tolist()
    seq = [1, 2, 3]
    for _ in range(6):
        seq.append(int(np.sum(seq[-3:]) % 7))
    assert got == seq[3:]
    whole = greedy_search(recompute_decoder(logits_fn), None, prompt, max_new_tokens=6)
    wide = greedy_search(recompute_decoder(logits_fn, window=64), None, prompt,
                         max_new_tokens=6)
    assert whole.tokens.tolist() == wide.tokens.tolist()
    with pytest.raises(ValueError, match=r"`window` must be an int >= 0 \(0: the whole"):
        recompute_decoder(logits_fn, window=-1)
