"""Parity with torch.nn.RNN/LSTM/GRU (several layers, bidirectional, packed variable lengths)."""

import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.interop import seqjax_to_torch_rnn, torch_rnn_to_seqjax

torch = pytest.importorskip("torch")

B, T, P, H = 3, 7, 4, 5
LENGTHS = np.array([7, 2, 5])


def _torch_packed(module, x, lengths):
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.from_numpy(x), torch.from_numpy(lengths), batch_first=True, enforce_sorted=False
    )
    out, state = module(packed)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
    return out.detach().numpy(), state


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_parity_packed(kind, bidirectional):
    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(P, H, num_layers=2, bidirectional=bidirectional,
                                     batch_first=True)
    stack, variables = torch_rnn_to_seqjax(module)
    x = np.random.default_rng(0).normal(size=(B, T, P)).astype(np.float32)
    y, finals = stack.apply(variables, jnp.asarray(x), jnp.asarray(LENGTHS), method="with_state")
    ref, state = _torch_packed(module, x, LENGTHS)
    np.testing.assert_allclose(np.asarray(y), ref, atol=1e-5)
    # Final hidden states: torch h_n is [layers * dirs, B, H].
    h_n = (state[0] if kind == "LSTM" else state).detach().numpy()
    dirs = 2 if bidirectional else 1
    for layer, carry in enumerate(finals):
        per_dir = carry if bidirectional else (carry,)
        for d in range(dirs):
            h = per_dir[d][1] if kind == "LSTM" else per_dir[d]
            np.testing.assert_allclose(np.asarray(h), h_n[layer * dirs + d], atol=1e-5)


def test_no_bias_and_relu():
    module = torch.nn.RNN(P, H, nonlinearity="relu", bias=False, batch_first=True)
    stack, variables = torch_rnn_to_seqjax(module)
    x = np.random.default_rng(1).normal(size=(B, T, P)).astype(np.float32)
    y = stack.apply(variables, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(y), module(torch.from_numpy(x))[0].detach().numpy(),
                               atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_round_trip_export(kind):
    module = getattr(torch.nn, kind)(P, H, num_layers=2, bidirectional=True, batch_first=True)
    stack, variables = torch_rnn_to_seqjax(module)
    back = seqjax_to_torch_rnn(stack, variables, input_size=P)
    for name, tensor in module.state_dict().items():
        if name.startswith("bias"):
            continue  # seqjax sums the two biases; compare outputs instead
        np.testing.assert_allclose(back.state_dict()[name].numpy(), tensor.numpy(), atol=1e-7)
    x = torch.randn(B, T, P)
    np.testing.assert_allclose(back(x)[0].detach().numpy(), module(x)[0].detach().numpy(),
                               atol=1e-5)


def test_rejects_non_rnn_modules():
    with pytest.raises(TypeError, match="module"):
        torch_rnn_to_seqjax(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="proj_size"):
        torch_rnn_to_seqjax(torch.nn.LSTM(P, H, proj_size=2))
