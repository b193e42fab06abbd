r"""Per-layer cost, sequential operations, path length: RNN, CNN, attention, linear attention, SSM.

What the sources state, and what is measured here:

* The slides' "RNN vs CNN vs self-attention" (three bullet lists, not a table) state the
  cost of a layer and its maximum path length: RNN ``O(N d²)``, path ``O(N)``; CNN
  ``O(k N d²)``, path ``O(N/k)``; self-attention ``O(N² d)``, path ``O(1)``; RNNs and
  CNNs are said to be not parallelisable / parallelisable "across sequence". Their
  "Transformers vs RNNs" table states only fast/slow training and inference. The hybrid
  slides state that linear attention brings ``O(N² d)`` down to ``O(N d²)`` and that SSMs
  are parallelisable with "linear scaling in sequence length" (no formula, no path length).
* Vaswani et al. (2017), Table 1 is the table with the three columns measured here —
  complexity per layer, sequential operations, maximum path length — for self-attention
  (``O(n² d)``, ``O(1)``, ``O(1)``), recurrent (``O(n d²)``, ``O(n)``, ``O(n)``) and
  convolutional layers (``O(k n d²)``, ``O(1)``, ``O(n/k)`` with contiguous kernels or
  ``O(log_k n)`` dilated). Bishop §12.1.8 gives attention's ``O(N² D)`` against the
  ``O(N D²)`` projections. Linear attention and SSMs are in neither table; their rows
  give what is measured only.

The rows are the library's layers, each on ``x: [1, T, d]``:

* ``rnn`` — :class:`seqjax.nn.RNN` of an :class:`~seqjax.nn.ElmanCell` (MEDL (7.2)),
  ``implementation="scan"``;
* ``cnn`` — one :class:`seqjax.nn.CausalConv1D` layer, ``d → d``, kernel ``k``
  (``--model.kernel_size``); its path length is that of the stack of ``L = ⌈(T − 1)/(k − 1)⌉``
  such layers whose receptive field ``1 + L(k − 1)`` covers the sequence (XLA's count
  leaves out the taps that fall on the left zero padding, so its FLOPs per token approach
  ``2kd² + d`` from below as T grows);
* ``cnn_dilated`` — one layer of a WaveNet-style stack, dilations ``1, k, k², …``
  (the layer measured has dilation ``k``: the same ``k`` taps, so the same cost); the
  stack needs ``L = ⌈log_k T⌉`` layers (receptive field ``k^L``);
* ``attention`` — causal :class:`seqjax.nn.MultiHeadAttention` (Bishop (12.15)–(12.19));
* ``linear_attention`` — causal :class:`seqjax.nn.LinearAttention` (Katharopoulos et al.
  2020; the chunked training form);
* ``ssm`` — :class:`seqjax.nn.SelectiveSSM` (Mamba's S6, associative scan).

Columns:

* **FLOPs** of one forward pass from XLA's cost analysis of the lowered program
  (``jax.jit(f).lower(params, x).cost_analysis()["flops"]``). XLA counts a loop body once,
  so every ``scan`` of length ``n`` found in the jaxpr adds ``n·F(body) − XLA(body)``
  (recursively), ``F(body)`` being the body's own cost analysis. The growth exponent is
  the least-squares slope of ``log FLOPs`` against ``log T``; per-token FLOPs are
  ``FLOPs / T``.
* **sequential operations**: the critical path of the jaxpr — the longest chain of
  primitives in which each needs the previous one's output (a matmul or a ``cumsum`` is
  one operation however large; a ``scan`` of length ``n`` counts ``n ×`` its body's
  critical path; calls and custom-derivative wrappers are entered).
* **maximum path length** (Vaswani's definition): the longest shortest path from an
  input position to an output position that depends on it, by breadth-first search
  over the position graph of the layer's equation — in its parallel (training) form and
  in its recurrent (generation) form: the RNN has only ``h_t ← (h_{t−1}, x_t)``;
  attention's ``y_i ← x_j`` (``j ≤ i``) is one hop in both (a KV cache keeps ``k_j, v_j``);
  linear attention's parallel form ``y_i = φ(q_i)ᵀ Σ_{j≤i} φ(k_j) v_jᵀ / …`` is one hop
  and its recurrent form ``S_t = S_{t−1} + φ(k_t)v_tᵀ`` a chain; the SSM's convolution
  form ``y_i = Σ_{j≤i} C_i (∏_{l=j+1}^{i} Ā_l) B̄_j x_j`` is one hop, its recurrence
  ``h_t = Ā_t h_{t−1} + B̄_t x_t`` a chain. A CNN has no recurrent form (generation
  recomputes the stack, as the slides say), so both columns are the stack's graph: nodes
  per layer and position, an edge from position ``t − j·r_l`` of layer ``l − 1`` to
  position ``t`` of layer ``l`` for each tap ``j``. That graph is layered, so every path
  from an input to an output has exactly ``L`` edges and the longest shortest path is
  ``L``; the experiment runs the breadth-first search layer by layer from ``x_1`` (numpy
  frontiers, as ``T·L`` nodes are too many for the dictionary search at T = 4096), which
  also checks that ``y_T`` is reached. The test checks that the graphs' reachability
  (``y_i`` depends on ``x_j`` iff ``j ≤ i``) is the layers' (for CNNs, the stacks')
  measured Jacobian pattern, and that the layer-by-layer search equals the dictionary
  search on small ``T``.

Run:  python -m seqjax.experiments.complexity --results_dir seqjax/experiments/results
      python -m seqjax.experiments.complexity --smoke --workdir /tmp/cx     (seconds)
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.extend import core as jex

from seqjax.experiments._config import PosInt, check_field_ranges, moved_into
from seqjax.experiments._kit import Task, command_line, train
from seqjax.experiments.reports.complexity import plot_costs, report
from seqjax.nn import (
    RNN,
    CausalConv1D,
    ElmanCell,
    LinearAttention,
    MultiHeadAttention,
    SelectiveSSM,
)

Array = jax.Array
Model = Literal["rnn", "cnn", "cnn_dilated", "attention", "linear_attention", "ssm"]
MODELS: tuple[str, ...] = get_args(Model)
CNNS = ("cnn", "cnn_dilated")


@dataclass(frozen=True)
class ModelOptions:
    """The sizes the compared layers share, one group of options ``--model.KEY``: every row's
    layer (``--models``, a top-level option, picks the rows) is built at this width, and each
    takes its own size (heads, state, kernel) from here.

    Attributes:
        width: model width ``d`` of every layer (also the RNN's state and the SSM's features).
        num_heads: heads of attention and linear attention.
        d_state: the SSM's state size ``N_s``.
        kernel_size: the CNNs' kernel ``k`` (≥ 2: a stack of ``k = 1`` layers never widens
            its receptive field); also the dilated stack's dilation base.
    """

    width: PosInt = 64
    num_heads: PosInt = 4
    d_state: PosInt = 16
    kernel_size: PosInt = 3


@dataclass(frozen=True)
class Config:
    """The options of ``seqjax train complexity`` (layers are traced and compiled, not run).

    Attributes:
        models: layers measured: ``rnn``, ``cnn``, ``cnn_dilated``, ``attention``,
            ``linear_attention`` and/or ``ssm``.
        lengths: sequence lengths ``T`` measured.
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        fit_last: growth exponents are fitted over this many of the largest lengths (2 to
            the number of lengths).
        seed: key of the layers' initialisation; only shapes are traced, so the results do
            not depend on it.
        workdir: ``complexity.md``, ``complexity.png`` and ``complexity.json``; unset = none.
        results_dir: also write ``complexity.md`` and ``complexity.png`` here (e.g.
            ``seqjax/experiments/results``); unset = not.
    """

    models: tuple[Model, ...] = MODELS
    lengths: tuple[PosInt, ...] = (64, 128, 256, 512, 1024, 2048, 4096)
    model: ModelOptions = ModelOptions()
    fit_last: PosInt = 3  # fit the growth exponent on the largest lengths
    seed: int = 0
    workdir: str | None = "workdirs/complexity"
    results_dir: str | None = None

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    def __post_init__(self) -> None:  # at the door (exit 2), before anything is written
        check_field_ranges(self)  # a value out of its own range is named first
        cnns = [m for m in self.models if m in CNNS]
        if cnns and self.model.kernel_size < 2:
            raise ValueError(f"--model.kernel_size must be >= 2 for the CNN rows ({cnns}); got "
                             f"{self.model.kernel_size}.")
        if not 2 <= self.fit_last <= len(self.lengths):
            raise ValueError(f"--fit_last must be in [2, len(lengths) = {len(self.lengths)}]; "
                             f"got {self.fit_last}.")


PRESETS = {"smoke": {"lengths": (16, 32, 64), "model.width": 8, "model.num_heads": 2,
                     "model.d_state": 4, "fit_last": 2}}


# ----------------------------------------------------------------------------- layers


def layer(name: str, cfg: Config) -> tuple[Any, Callable[[Any, Array], Array]]:
    """``(module, f(params, x))`` for one of :data:`MODELS`."""
    m = cfg.model
    if name == "rnn":
        module: Any = RNN(ElmanCell(m.width), implementation="scan")
        return module, lambda p, x: module.apply(p, x)
    if name in CNNS:
        module = CausalConv1D(
            m.width, kernel_size=m.kernel_size, dilation=1 if name == "cnn" else m.kernel_size
        )
        return module, lambda p, x: module.apply(p, x)
    if name == "attention":
        module = MultiHeadAttention(num_heads=m.num_heads)
        return module, lambda p, x: module.apply(p, x, is_causal=True)
    if name == "linear_attention":
        module = LinearAttention(num_heads=m.num_heads)
        return module, lambda p, x: module.apply(p, x, is_causal=True)
    if name == "ssm":
        module = SelectiveSSM(features=m.width, d_state=m.d_state)
        return module, lambda p, x: module.apply(p, x)
    raise ValueError(f"`models` must be drawn from {MODELS}; got {name!r}.")


def conv_dilations(name: str, num_steps: int, kernel_size: int) -> list[int]:
    """Dilations of the smallest causal-conv stack whose receptive field covers ``num_steps``:
    ``[1] * L`` (``cnn``) or ``[1, k, k², …]`` (``cnn_dilated``); at least one layer."""
    if name not in CNNS:
        raise ValueError(f"`name` must be one of {CNNS}; got {name!r}.")
    if kernel_size < 2:
        raise ValueError(f"`kernel_size` must be >= 2 for a stack to cover T; got {kernel_size}.")
    dilations: list[int] = []
    field = 1
    while field < num_steps or not dilations:
        r = 1 if name == "cnn" else kernel_size ** len(dilations)
        dilations.append(r)
        field += (kernel_size - 1) * r
    return dilations


def stack(name: str, cfg: Config, num_steps: int) -> tuple[Any, Callable[[Any, Array], Array]]:
    """``(module, f(params, x))``: the layer itself, or for a CNN the stack of
    :func:`conv_dilations` layers (the module whose paths the position graph describes)."""
    if name not in CNNS:
        return layer(name, cfg)
    m = cfg.model
    module = nn.Sequential(
        [
            CausalConv1D(m.width, kernel_size=m.kernel_size, dilation=r)
            for r in conv_dilations(name, num_steps, m.kernel_size)
        ]
    )
    return module, lambda p, x: module.apply(p, x)


# ----------------------------------------------------------------------------- FLOPs


def _xla_flops(fn: Callable, *args: Any) -> float:
    cost = jax.jit(fn).lower(*args).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0))


def _avals(jaxpr: Any) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]


def _closed(j: Any) -> Any:
    return j if isinstance(j, jex.ClosedJaxpr) else jex.ClosedJaxpr(j, ())


def _loop_correction(jaxpr: Any) -> float:
    """``Σ_scans n·F(body) − XLA(body)`` over the scans of ``jaxpr`` (entering calls)."""
    extra = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            body = eqn.params["jaxpr"]
            once = _xla_flops(jex.jaxpr_as_fun(body), *_avals(body.jaxpr))
            full = once + _loop_correction(body.jaxpr)
            extra += eqn.params["length"] * full - once
        elif eqn.primitive.name == "while":
            raise ValueError(
                "a `while` loop has no static trip count; its FLOPs cannot be counted (use a scan)."
            )
        else:
            for sub in jex.jaxprs_in_params(eqn.params):
                extra += _loop_correction(sub)
    return extra


def forward_flops(fn: Callable, params: Any, x: Any) -> float:
    """FLOPs of ``fn(params, x)``: XLA's cost analysis, with every scan counted ``n`` times."""
    closed = jax.make_jaxpr(fn)(params, x)
    return _xla_flops(fn, params, x) + _loop_correction(closed.jaxpr)


# ----------------------------------------------------------------------------- depth


def critical_path(jaxpr: Any) -> int:
    """The longest chain of dependent primitives in ``jaxpr`` (scans × their length)."""
    depth: dict[Any, int] = collections.defaultdict(int)
    out = 0
    for eqn in jaxpr.eqns:
        base = max((depth[v] for v in eqn.invars if not isinstance(v, jex.Literal)), default=0)
        name = eqn.primitive.name
        if name == "scan":
            cost = eqn.params["length"] * max(critical_path(eqn.params["jaxpr"].jaxpr), 1)
        elif name == "cond":
            cost = max(critical_path(b.jaxpr) for b in eqn.params["branches"])
        else:
            subs = list(jex.jaxprs_in_params(eqn.params))
            cost = max((critical_path(s) for s in subs), default=1) if subs else 1
        for v in eqn.outvars:
            depth[v] = base + cost
        out = max(out, base + cost)
    return out


def sequential_ops(fn: Callable, params: Any, x: Any) -> int:
    return critical_path(jax.make_jaxpr(fn)(params, x).jaxpr)


# ----------------------------------------------------------------------------- path length


def position_graph(
    name: str, num_steps: int, form: str, kernel_size: int = 3
) -> dict[str, list[str]]:
    """Edges (node -> successors) of the layer's equation over positions ``1..T``.

    ``x{j}`` are inputs, ``y{i}`` outputs, ``s{t}`` recurrent states, ``c{l}_{t}`` the
    outputs of a CNN stack's layer ``l`` (the stack of :func:`conv_dilations`, kernel
    ``kernel_size``; the same graph in both forms). ``form``: ``"parallel"`` or
    ``"recurrent"`` (see the module docstring)."""
    if form not in ("parallel", "recurrent"):
        raise ValueError(f"`form` must be 'parallel' or 'recurrent'; got {form!r}.")
    if name not in MODELS:
        raise ValueError(f"`name` must be one of {MODELS}; got {name!r}.")
    g: dict[str, list[str]] = collections.defaultdict(list)
    if name in CNNS:
        dilations = conv_dilations(name, num_steps, kernel_size)
        names = ["x"] + [f"c{l}_" for l in range(1, len(dilations))] + ["y"]
        for l, r in enumerate(dilations):
            for t in range(1, num_steps + 1):
                for j in range(kernel_size):
                    if t + j * r <= num_steps:
                        g[f"{names[l]}{t}"].append(f"{names[l + 1]}{t + j * r}")
        return g
    chain = name == "rnn" or (form == "recurrent" and name in ("linear_attention", "ssm"))
    for t in range(1, num_steps + 1):
        if chain:
            g[f"x{t}"].append(f"s{t}")
            if t > 1:
                g[f"s{t - 1}"].append(f"s{t}")
            g[f"s{t}"].append(f"y{t}")
        else:
            g[f"x{t}"] += [f"y{i}" for i in range(t, num_steps + 1)]
    return g


def max_path_length(graph: dict[str, list[str]], num_steps: int) -> int:
    """Longest over ``(j, i)`` with ``y_i`` reachable from ``x_j`` of the shortest path length
    (breadth-first search); edges into and out of the state count as one hop each, so a
    direct edge ``x_j → y_i`` is 1 and the chain ``x_1 → s_1 → … → s_T → y_T`` is ``T + 1``."""
    longest = 0
    for j in range(1, num_steps + 1):
        dist = {f"x{j}": 0}
        queue = collections.deque([f"x{j}"])
        while queue:
            u = queue.popleft()
            for v in graph.get(u, ()):
                if v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        longest = max([longest] + [d for n, d in dist.items() if n.startswith("y")])
    return longest


def conv_path_length(name: str, num_steps: int, kernel_size: int) -> int:
    """The longest shortest path of the CNN stack's layered position graph, by breadth-first
    search from ``x_1`` one layer at a time (a numpy frontier over positions): every path
    has one edge per layer, so it is the stack's depth ``L`` once ``y_T`` is reached."""
    reach_T = np.zeros(num_steps, bool)
    reach_T[0] = True
    dist = 0
    for r in conv_dilations(name, num_steps, kernel_size):
        nxt = reach_T.copy()
        for j in range(1, kernel_size):
            nxt[j * r :] |= reach_T[: max(num_steps - j * r, 0)]
        reach_T, dist = nxt, dist + 1
    if not reach_T[-1]:
        raise AssertionError(f"y_{num_steps} is not reachable from x_1 in the {name} stack.")
    return dist


def reachability(graph: dict[str, list[str]], num_steps: int) -> np.ndarray:
    """``bool[T, T]``: ``[i, j]`` True when ``y_{i+1}`` is reachable from ``x_{j+1}``."""
    out = np.zeros((num_steps, num_steps), bool)
    for j in range(1, num_steps + 1):
        seen, stack = {f"x{j}"}, [f"x{j}"]
        while stack:
            for v in graph.get(stack.pop(), ()):
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        for n in seen:
            if n.startswith("y"):
                out[int(n[1:]) - 1, j - 1] = True
    return out


# ----------------------------------------------------------------------------- experiment


def measure(name: str, cfg: Config, num_steps: int) -> dict[str, Any]:
    module, fn = layer(name, cfg)
    k = cfg.model.kernel_size
    x = jax.ShapeDtypeStruct((1, num_steps, cfg.model.width), jnp.float32)
    params = jax.eval_shape(module.init, jax.random.PRNGKey(cfg.seed), x)
    flops = forward_flops(fn, params, x)
    if name in CNNS:
        path = conv_path_length(name, num_steps, k)
        paths = {
            "path_parallel": path,
            "path_recurrent": path,
            "layers": len(conv_dilations(name, num_steps, k)),
        }
    else:
        paths = {
            f"path_{form}": max_path_length(position_graph(name, num_steps, form), num_steps)
            for form in ("parallel", "recurrent")
        }
        paths["layers"] = 1
    return {
        "model": name,
        "T": num_steps,
        "flops": flops,
        "flops_per_token": flops / num_steps,
        "sequential_ops": sequential_ops(fn, params, x),
        **paths,
    }


def growth(rows: list[dict], key: str, last: int) -> float:
    """Least-squares slope of ``log key`` against ``log T`` over the ``last`` largest T."""
    rs = sorted(rows, key=lambda r: r["T"])[-last:]
    t = np.log([r["T"] for r in rs])
    y = np.log([max(float(r[key]), 1e-12) for r in rs])
    return float(np.polyfit(t, y, 1)[0])


def build(cfg: Config) -> Task:
    """The measurements train nothing: a task with no runs whose ``summarize`` hook measures
    every model at every length (:func:`measure`) and fits the growth exponents; the
    markdown and the figure as hooks."""
    for m in cfg.models:
        if m not in MODELS:
            raise ValueError(f"`models` must be drawn from {MODELS}; got {m!r}.")
    started = time.perf_counter()

    def summarize(_: list) -> dict:
        rows = [measure(m, cfg, t) for m in cfg.models for t in sorted(cfg.lengths)]
        fits = {
            m: {
                k: growth([r for r in rows if r["model"] == m], k, cfg.fit_last)
                for k in ("flops", "sequential_ops")
            }
            for m in cfg.models
        }
        return {"rows": rows, "fits": fits, "wall_s": time.perf_counter() - started}

    return Task(
        "complexity", [], started=started, summarize=summarize,
        report=lambda s: report(cfg, s["rows"], s["fits"], s["wall_s"],
                                command_line("complexity", cfg), cnns=CNNS),
        files=lambda folder, s: plot_costs(cfg, s["rows"], folder))


def run(cfg: Config) -> dict:
    """Measure every model at every length; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()
