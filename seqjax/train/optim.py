r"""Optimisers, learning-rate schedules, weight-decay masks and the ``TrainState`` (from optax).

* ``adamw`` (decoupled weight decay, Loshchilov & Hutter 2019), ``adam``, ``sgd`` (optional
  momentum / Nesterov; weight decay added to the gradient) and ``muon`` (Jordan et al. 2024):
  the hidden weight matrices follow Newton–Schulz-orthogonalised Nesterov momentum, every other
  parameter AdamW, each :data:`MUON_GROUPS` group with its own rate and decay
  (:func:`param_groups`). For a matrix ``W`` (fan-in ``A``, fan-out ``B``), gradient ``G_t``,
  momentum ``μ``, rate ``η_t`` and decay ``λ``:

  .. math::
      M_t = μ M_{t-1} + G_t,\qquad N_t = G_t + μ M_t \ (\text{Nesterov; else } N_t = M_t),

      O_t = \mathrm{NS}_k(N_t / \lVert N_t \rVert_F),\qquad
      W_t = W_{t-1} - η_t \big(\sqrt{\max(1, B/A)}\, O_t + λ W_{t-1}\big)

  with ``NS_k`` ``k`` (``ns_steps``) steps of the quintic ``X ← aX + (bA + cA²)X``, ``A = XXᵀ``,
  ``(a, b, c) = ns_coeffs``: ``torch.optim.Muon``'s update (``adjust_lr_fn="original"``; its
  ``(1 - μ)`` momentum scale cancels in the normalisation). A scanned stack's ``[L, …]`` weights
  are ``L`` matrices; an attention projection ``[D, H, K]`` is one ``D × HK`` matrix. Not
  ``optax.contrib.muon``: that bias-corrects the momentum (a different direction from the
  second step) and uses Nesterov-Adam for the other groups;
* schedules (``s`` = optimizer update count from 0, ``w`` = warm-up steps, ``S`` = total):
  ``constant`` ``η_0`` after an optional linear warm-up; ``warmup_cosine`` linear ``0 → η_0``
  over ``w`` steps, then ``η_end + (η_0 - η_end)(1 + cos(π (s - w)/(S - w)))/2``; ``linear``
  warm-up, then linear decay to ``η_end`` at ``S``; ``inverse_sqrt`` (Vaswani et al. 2017,
  eq. (3)) ``η_0 · min(n/w, sqrt(w/n))``, ``n = s + 1``;
* global-norm clipping before the optimiser, the slides' ``g ← η g/‖g‖ if ‖g‖ > η``
  (keeps the direction);
* a weight-decay mask (:func:`decay_mask`) that decays matrices only;
* freezing (:func:`freeze`, :func:`trainable_mask`): ``θ_{s+1} = θ_s + m ⊙ u_s(g_s)`` with the
  trainable mask ``m`` and ``u_s`` computed on ``{θ : m = 1}`` only. MEDL §7.1 (frozen or
  fine-tuned embeddings), §7.5 (training only the output layer, or the encoder or decoder);
  Bishop §12.3.3 (fine-tuning), §12.3.5 (LoRA: ``W_0`` frozen, (12.36)).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from optax.contrib._muon import (  # optax's public muon bias-corrects its momentum (above)
    MuonDimensionNumbers,
    orthogonalize_via_newton_schulz,
    scale_by_shape,
)

from seqjax._checks import ConfigBase, check_positive_int, check_rate
from seqjax.utils import count_params

Array = jax.Array
Trainable = Any  # a pytree of bools, a predicate ``(path, leaf) -> bool``, or regexes

__all__ = ["OptimizerConfig", "MUON_GROUPS", "param_groups", "muon_dimension_numbers",
           "TrainState", "DEFAULT_NO_DECAY", "decay_mask", "path_to_str", "make_schedule",
           "make_optimizer", "warmup_cosine_schedule", "linear_schedule",
           "inverse_sqrt_schedule", "constant_schedule", "freeze", "trainable_mask"]

OPTIMIZERS = ("adamw", "adam", "sgd", "muon")
#: Muon's parameter groups (:func:`param_groups`): the hidden matrices (Muon), then AdamW's:
#: embedding tables, output heads, and vectors (norm scales, biases, scalars).
MUON_GROUPS = ("matrix", "embed", "head", "scalar")
#: Keller Jordan's quintic Newton–Schulz coefficients (optax's and torch's default).
NS_COEFFS = (3.4445, -4.7750, 2.0315)
_MUON_ONLY = ("ns_steps", "ns_coeffs", "group_learning_rates", "group_weight_decays")
SCHEDULES = ("constant", "warmup_cosine", "linear", "inverse_sqrt")

# Path patterns (searched in the lower-cased "a/b/c" path) excluded from weight decay
# in addition to every leaf with ndim < 2.
DEFAULT_NO_DECAY: tuple[str, ...] = (
    r"(^|/)bias$",
    r"(^|/)(scale|gamma|beta)$",
    r"norm",
    r"(^|/)ln_?[a-z0-9]*(/|$)",
    r"embed",
    r"(^|/)(wte|wpe)(/|$)",
    r"pos(ition(al)?)?_?emb",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(ConfigBase):
    """What :func:`make_optimizer` builds.

    Attributes:
        name: ``"adamw"``, ``"adam"``, ``"sgd"`` or ``"muon"`` (the module docstring).
        learning_rate: the peak rate ``η_0``.
        schedule: ``"constant"``, ``"warmup_cosine"``, ``"linear"`` or ``"inverse_sqrt"``.
        warmup_steps: linear warm-up length ``w`` (optimizer updates).
        steps: ``S``, where cosine/linear decay ends (required by those): the run's length.
        min_lr_ratio: ``η_end / η_0`` for cosine/linear decay.
        beta1, beta2, eps: Adam's ``β_1``, ``β_2`` and epsilon.
        weight_decay: decoupled (adamw) or L2-as-gradient (sgd) decay; 0 = off. Muon: the decay
            ``η λ W`` (as torch's) of the ``matrix`` and ``head`` groups unless
            ``group_weight_decays`` says otherwise; ``embed`` and ``scalar`` are not decayed.
        momentum, nesterov: SGD's momentum (unset: 0, plain SGD) and Nesterov (unset: off);
            Muon's ``μ`` (unset: 0.95) and Nesterov (unset: on).
        ns_steps, ns_coeffs: Muon's Newton–Schulz steps ``k`` and coefficients ``(a, b, c)``.
        group_learning_rates: Muon's per-group peak rates, ``(("embed", 0.3), ...)`` with names
            from :data:`MUON_GROUPS`; others use ``learning_rate``; each follows ``schedule``.
        group_weight_decays: Muon's per-group decays, ``(("head", 0.0), ...)``.
        clip_norm: global-norm clipping threshold ``η``; 0 = off.
        flat_optimizer: keep Adam's ``m``, ``v`` (SGD's momentum) as one vector each
            (``optax.flatten``): the same update up to rounding, ~3× fewer state leaves, cheaper
            dispatch. Changes the ``opt_state`` layout: resume only with the same setting.
        no_decay: regexes of parameter paths excluded from weight decay.
    """

    name: str = "adamw"
    learning_rate: float = 1e-3
    schedule: str = "constant"
    warmup_steps: int = 0
    steps: int | None = None
    min_lr_ratio: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float | None = None
    nesterov: bool | None = None
    ns_steps: int = 5
    ns_coeffs: tuple[float, float, float] = NS_COEFFS
    group_learning_rates: tuple[tuple[str, float], ...] = ()
    group_weight_decays: tuple[tuple[str, float], ...] = ()
    clip_norm: float = 0.0
    flat_optimizer: bool = False
    no_decay: tuple[str, ...] = DEFAULT_NO_DECAY

    def __post_init__(self) -> None:
        for field, allowed in (("name", OPTIMIZERS), ("schedule", SCHEDULES)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"`{field}` must be one of {allowed}; got "
                                 f"{getattr(self, field)!r}.")
        for field in ("learning_rate", "warmup_steps"):
            if getattr(self, field) < 0:
                raise ValueError(f"`{field}` must be >= 0; got {getattr(self, field)}.")
        if self.clip_norm is None or not self.clip_norm >= 0:  # one meaning of off: 0
            raise ValueError(f"`clip_norm` must be >= 0 (0 = no clipping); got "
                             f"{self.clip_norm}.")
        self._check_muon()
        if self.schedule in ("warmup_cosine", "linear") and (
                self.steps is None or self.steps <= self.warmup_steps):
            raise ValueError(f"schedule {self.schedule!r} needs `steps` > `warmup_steps` "
                             f"({self.warmup_steps}); got steps={self.steps}.")

    def _check_muon(self) -> None:
        if self.momentum is not None:
            check_rate(self.momentum, "momentum")
        if self.name != "muon":
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            if changed := [k for k in _MUON_ONLY if getattr(self, k) != defaults[k]]:
                raise ValueError(f"{changed} are options of the 'muon' optimizer; got "
                                 f"name={self.name!r}.")
            return
        if self.no_decay != DEFAULT_NO_DECAY:
            raise ValueError("`no_decay` is the decay mask of adamw/adam/sgd; 'muon' decays "
                             "by parameter group: set `group_weight_decays` "
                             f"(groups {MUON_GROUPS}); got no_decay={self.no_decay!r}.")
        check_positive_int(self.ns_steps, "ns_steps")
        if len(tuple(self.ns_coeffs)) != 3:
            raise ValueError(f"`ns_coeffs` must be three numbers (a, b, c); got "
                             f"{self.ns_coeffs!r}.")
        for field in ("group_learning_rates", "group_weight_decays"):
            for item in getattr(self, field):
                if len(item) != 2 or item[0] not in MUON_GROUPS or not item[1] >= 0:
                    raise ValueError(f"`{field}` must be (group, value >= 0) pairs with a "
                                     f"group in {MUON_GROUPS}; got {item!r}.")

    def group_learning_rate(self, group: str) -> float:
        """Muon: ``group``'s ``group_learning_rates`` entry, else ``learning_rate``."""
        return dict(self.group_learning_rates).get(group, self.learning_rate)

    def group_weight_decay(self, group: str) -> float:
        """Muon: ``group``'s ``group_weight_decays`` entry, else ``weight_decay`` for
        ``matrix``/``head`` and 0 for ``embed``/``scalar``."""
        default = self.weight_decay if group in ("matrix", "head") else 0.0
        return dict(self.group_weight_decays).get(group, default)


# ----------------------------------------------------------------------------- schedules


def constant_schedule(peak_value: float, warmup_steps: int = 0) -> optax.Schedule:
    """``η(s) = η_0 · min(1, s / w)`` (a constant after an optional linear warm-up).

    Example:
        >>> f = constant_schedule(1.0, warmup_steps=4)
        >>> [float(f(s)) for s in (0, 2, 4, 100)]
        [0.0, 0.5, 1.0, 1.0]
    """
    return _after_warmup(peak_value, warmup_steps, optax.constant_schedule(peak_value))


def _after_warmup(peak_value: float, warmup_steps: int, then: optax.Schedule) -> optax.Schedule:
    """A linear warm-up ``0 → peak_value`` over ``warmup_steps`` (if any), then ``then``."""
    if warmup_steps <= 0:
        return then
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak_value, warmup_steps), then], [warmup_steps])


def warmup_cosine_schedule(peak_value: float, warmup_steps: int, total_steps: int,
                           end_value: float = 0.0) -> optax.Schedule:
    """Linear warm-up to ``peak_value`` then cosine decay to ``end_value`` at ``total_steps``.

    Example:
        >>> f = warmup_cosine_schedule(1.0, 10, 110)
        >>> [round(float(f(s)), 3) for s in (0, 5, 10, 60, 110)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
    """
    return optax.warmup_cosine_decay_schedule(0.0, peak_value, warmup_steps, total_steps,
                                              end_value)


def linear_schedule(peak_value: float, warmup_steps: int, total_steps: int,
                    end_value: float = 0.0) -> optax.Schedule:
    """Linear warm-up to ``peak_value`` then linear decay to ``end_value`` at ``total_steps``.

    Example:
        >>> f = linear_schedule(1.0, 10, 110)
        >>> [round(float(f(s)), 3) for s in (5, 10, 60, 110, 200)]
        [0.5, 1.0, 0.5, 0.0, 0.0]
    """
    decay = optax.linear_schedule(peak_value, end_value, total_steps - warmup_steps)
    return _after_warmup(peak_value, warmup_steps, decay)


def inverse_sqrt_schedule(peak_value: float, warmup_steps: int) -> optax.Schedule:
    r"""Vaswani et al. (2017) eq. (3): ``η(s) = η_0 · min(n / w, sqrt(w / n))``, ``n = s + 1``.

    ``η_0 = (d_model · w)^{-1/2}`` gives Vaswani's ``d_model^{-1/2} min(n^{-1/2}, n w^{-3/2})``;
    ``w = 0``: no warm-up (``η_0 / sqrt(n)``).

    Example:
        >>> f = inverse_sqrt_schedule(1.0, 4)
        >>> [round(float(f(s)), 3) for s in (0, 3, 15)]
        [0.25, 1.0, 0.5]
    """
    w = float(max(warmup_steps, 1))

    def schedule(count: Array) -> Array:
        n = jnp.asarray(count, jnp.float32) + 1.0
        return peak_value * jnp.minimum(n / w, jnp.sqrt(w / n))

    return schedule


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """The learning-rate schedule named by ``cfg.schedule`` (see the module docstring)."""
    peak, end = cfg.learning_rate, cfg.learning_rate * cfg.min_lr_ratio
    if cfg.schedule == "constant":
        return constant_schedule(peak, cfg.warmup_steps)
    if cfg.schedule == "inverse_sqrt":
        return inverse_sqrt_schedule(peak, cfg.warmup_steps)
    assert cfg.steps is not None  # OptimizerConfig requires it for the decaying schedules
    decay = warmup_cosine_schedule if cfg.schedule == "warmup_cosine" else linear_schedule
    return decay(peak, cfg.warmup_steps, cfg.steps, end)


# ----------------------------------------------------------------------------- decay mask


def path_to_str(path: Sequence[Any]) -> str:
    """``"a/b/0/c"`` from a ``jax.tree_util`` key path."""
    return "/".join(str(next((getattr(k, a) for a in ("key", "name", "idx") if hasattr(k, a)), k))
                    for k in path)


def decay_mask(params: Any, no_decay: Sequence[str] = DEFAULT_NO_DECAY) -> Any:
    """Boolean tree, True where weight decay applies: matrices not matching ``no_decay``.

    ``ndim < 2`` leaves are never decayed; ``DEFAULT_NO_DECAY`` matches ``bias``, ``scale``,
    ``*norm*``, ``ln_*``, ``*embed*``, ``wte``, ``wpe``, ``pos_emb``.

    Example:
        >>> import jax.numpy as jnp
        >>> p = {"Embed_0": {"embedding": jnp.ones((5, 2))},
        ...      "Dense_0": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
        >>> decay_mask(p)
        {'Dense_0': {'bias': False, 'kernel': True}, 'Embed_0': {'embedding': False}}
    """
    patterns = [re.compile(p) for p in no_decay]
    return jax.tree_util.tree_map_with_path(  # matrices whose path matches no pattern
        lambda path, leaf: jnp.ndim(leaf) >= 2 and not any(
            p.search(path_to_str(path).lower()) for p in patterns), params)


# ----------------------------------------------------------------------------- optimizer


def make_optimizer(cfg: OptimizerConfig, *, trainable: Trainable | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Build ``clip → optimiser`` from ``cfg``; returns ``(tx, schedule)``. ``trainable``
    (optional): train only these parameters (:func:`freeze`).

    Example:
        >>> tx, lr = make_optimizer(OptimizerConfig(learning_rate=1e-2, weight_decay=0.1))
        >>> float(lr(0))
        0.01
    """
    schedule = make_schedule(cfg)
    lr = optax.scale_by_learning_rate(schedule)
    # flat_optimizer: only the stateful first link (``scale_by_adam`` or ``trace``) goes in
    # ``optax.flatten``; elementwise, so only the state layout changes.
    flat = optax.flatten if cfg.flat_optimizer else lambda tx: tx
    decay = optax.add_decayed_weights(cfg.weight_decay, lambda p: decay_mask(p, cfg.no_decay))
    sgd_decay = [decay] if cfg.weight_decay else []
    if cfg.name == "muon":
        opt = _muon(cfg)
    elif cfg.name in ("adamw", "adam"):  # optax.adamw / optax.adam, link for link
        adam = flat(optax.scale_by_adam(b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps))
        opt = optax.chain(adam, decay, lr) if cfg.name == "adamw" else optax.chain(adam, lr)
    elif cfg.flat_optimizer:  # sgd with no link for no momentum
        trace = [flat(optax.trace(cfg.momentum, bool(cfg.nesterov)))] if cfg.momentum else []
        opt = optax.chain(*sgd_decay, *trace, lr)
    else:
        opt = optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=bool(cfg.nesterov))
        opt = optax.chain(*sgd_decay, opt) if sgd_decay else opt
    if cfg.clip_norm:
        opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    if trainable is not None:
        opt = freeze(opt, trainable)
    return opt, schedule


# ----------------------------------------------------------------------------- Muon

_STACKED = re.compile(r"(^|/)layers(/|$)")  # a scanned stack (nn.scan) of [L, ...] leaves
_EMBED = re.compile(r"embed|(^|/)(wte|wpe)(/|$)|pos(ition(al)?)?_?emb")
_HEAD = re.compile(r"(^|/)([a-z0-9]+_)?head(/|$)")
_MULTI_OUT = re.compile(r"(^|/)(query|key|value)/kernel$")  # DenseGeneral [D, H, K]


def _stacked_axes(name: str) -> int:
    return 1 if _STACKED.search(name) else 0


def param_groups(params: Any) -> Any:
    """Muon's group of every parameter (:data:`MUON_GROUPS`), a tree of names.

    On the lower-cased ``"a/b/c"`` path, not counting a scanned stack's layer axis (a path
    through ``layers/``): a bias or fewer than 2 axes → ``scalar``; an embedding (``*embed*``,
    ``wte``, ``wpe``) → ``embed``; an output head (``head``, ``lm_head``, ``*_head``) → ``head``;
    else ``matrix`` (orthogonalised).

    Example:
        >>> import jax.numpy as jnp
        >>> p = {"wte": jnp.ones((9, 4)), "lm_head": jnp.ones((4, 9)),
        ...      "layers": {"up": jnp.ones((2, 4, 8)), "b": jnp.ones((2, 8))}}
        >>> param_groups(p)
        {'layers': {'b': 'scalar', 'up': 'matrix'}, 'lm_head': 'head', 'wte': 'embed'}
    """
    def group(path: Sequence[Any], leaf: Any) -> str:
        name = path_to_str(path).lower()
        if jnp.ndim(leaf) - _stacked_axes(name) < 2 or name.endswith("bias"):
            return "scalar"
        if _EMBED.search(name):
            return "embed"
        return "head" if _HEAD.search(name) else "matrix"

    return jax.tree_util.tree_map_with_path(group, params)


def muon_dimension_numbers(params: Any) -> Any:
    """Each ``matrix``-group leaf's ``MuonDimensionNumbers(reduction_axis, output_axis)`` (``None``
    elsewhere); other axes batch matrices orthogonalised separately (a scanned stack's layers).
    ``[in, out]`` is itself; attention query/key/value ``[D, H, K]`` is one ``D × HK`` matrix,
    its output ``[H, K, D]`` one ``HK × D``: PyTorch's ``nn.Linear`` weights."""
    groups = param_groups(params)

    def dims(path: Sequence[Any], leaf: Any, group: str) -> MuonDimensionNumbers | None:
        if group != "matrix":
            return None
        name = path_to_str(path).lower()
        s, n = _stacked_axes(name), jnp.ndim(leaf)
        if _MULTI_OUT.search(name):
            return MuonDimensionNumbers(s, tuple(range(s + 1, n)))
        return MuonDimensionNumbers(tuple(range(s, n - 1)), n - 1)

    return jax.tree_util.tree_map_with_path(dims, params, groups)


def _as_matrices(x: Array, dims: MuonDimensionNumbers) -> tuple[Array, Callable[[Array], Array]]:
    """``x`` as ``[batch, fan_in, fan_out]`` (its batch axes first) and the inverse map."""
    red = (dims.reduction_axis,) if isinstance(dims.reduction_axis, int) else dims.reduction_axis
    out = (dims.output_axis,) if isinstance(dims.output_axis, int) else dims.output_axis
    red, out = tuple(a % x.ndim for a in red), tuple(a % x.ndim for a in out)
    order = tuple(a for a in range(x.ndim) if a not in red + out) + red + out
    moved = x.transpose(order)
    size = lambda axes: math.prod(x.shape[a] for a in axes)
    flat = moved.reshape(-1, size(red), size(out))
    inverse = tuple(order.index(a) for a in range(x.ndim))
    return flat, lambda y: y.reshape(moved.shape).transpose(inverse)


def _orthogonalize(ns_coeffs: tuple[float, ...], ns_steps: int) -> optax.GradientTransformation:
    """Stateless: each update matrix → its Newton–Schulz orthogonalisation, same-shape matrices
    stacked into one batched call (modded-nanogpt's grouping)."""
    coeffs = jnp.asarray(ns_coeffs, jnp.float32)
    batched = MuonDimensionNumbers(1, 2)  # [batch, fan_in, fan_out]

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        dims = jax.tree_util.tree_leaves(  # one per matrix leaf (the group holds no other)
            muon_dimension_numbers(updates),
            is_leaf=lambda d: d is None or isinstance(d, MuonDimensionNumbers))
        mats = [_as_matrices(u, d) for u, d in zip(leaves, dims)]
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, (m, _) in enumerate(mats):
            by_shape.setdefault(m.shape[1:], []).append(i)
        out: list[Any] = [None] * len(leaves)
        for idx in by_shape.values():
            stacked = jnp.concatenate([mats[i][0] for i in idx])
            ortho = orthogonalize_via_newton_schulz(stacked, coeffs, ns_steps,
                                                    dimension_numbers=batched)
            pieces = jnp.split(ortho, list(itertools.accumulate(
                mats[i][0].shape[0] for i in idx))[:-1])
            for i, piece in zip(idx, pieces):
                out[i] = mats[i][1](piece)
        return jax.tree_util.tree_unflatten(treedef, out), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def _muon(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """``cfg``'s Muon: ``optax.multi_transform`` over :func:`param_groups`, Muon for ``matrix``,
    AdamW for the others, each on ``cfg.schedule`` at its group's peak rate and decay."""
    def maybe_flat(tx: optax.GradientTransformation) -> optax.GradientTransformation:
        if not cfg.flat_optimizer:
            return tx
        flat = optax.flatten(tx)  # which cannot flatten a group with no parameters
        pick = lambda tree: flat if jax.tree_util.tree_leaves(tree) else tx
        return optax.GradientTransformation(
            lambda params: pick(params).init(params),
            lambda updates, state, params=None: pick(updates).update(updates, state, params))

    def tail(group: str) -> list[optax.GradientTransformation]:
        rate = make_schedule(dataclasses.replace(cfg, learning_rate=cfg.group_learning_rate(group)))
        return [optax.add_decayed_weights(cfg.group_weight_decay(group)),
                optax.scale_by_learning_rate(rate)]

    momentum = 0.95 if cfg.momentum is None else cfg.momentum
    nesterov = True if cfg.nesterov is None else cfg.nesterov
    transforms = {"matrix": optax.chain(
        maybe_flat(optax.trace(decay=momentum, nesterov=nesterov)),
        _orthogonalize(tuple(cfg.ns_coeffs), cfg.ns_steps),
        scale_by_shape(muon_dimension_numbers), *tail("matrix"))}
    for group in MUON_GROUPS[1:]:
        transforms[group] = optax.chain(
            maybe_flat(optax.scale_by_adam(b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps)), *tail(group))

    def labels(params: Any) -> Any:
        groups = param_groups(params)
        if "matrix" not in jax.tree_util.tree_leaves(groups):
            raise ValueError("optimizer 'muon' has no matrix to orthogonalise: every parameter "
                             "is an embedding, a head or a vector (param_groups); use 'adamw'.")
        return groups

    return optax.multi_transform(transforms, labels)


# ----------------------------------------------------------------------------- freezing

def trainable_mask(params: Any, trainable: Trainable) -> Any:
    """The boolean tree (True = trained) that ``trainable`` describes for ``params``.

    ``trainable``: a pytree of Python/NumPy bools shaped like ``params``; a predicate
    ``f(path: str, leaf) -> bool`` on the ``"a/b/c"`` path (:func:`path_to_str`); or regexes
    (one or a tuple/list), trainable when one is found (``re.search``) in the path.

    Example:
        >>> import jax.numpy as jnp
        >>> p = {"encoder": {"kernel": jnp.ones((2, 2))}, "head": {"kernel": jnp.ones((2, 3))}}
        >>> trainable_mask(p, r"^head/")
        {'encoder': {'kernel': False}, 'head': {'kernel': True}}
    """
    if isinstance(trainable, str | tuple | list):
        patterns = [trainable] if isinstance(trainable, str) else list(trainable)
        if not all(isinstance(p, str) for p in patterns):
            raise TypeError(f"`trainable` regexes must be strings; got {trainable!r}.")
        compiled = [re.compile(p) for p in patterns]
        return jax.tree_util.tree_map_with_path(
            lambda path, _: any(c.search(path_to_str(path)) for c in compiled), params)
    if callable(trainable):
        def call(path: Sequence[Any], leaf: Any) -> bool:
            out = trainable(path_to_str(path), leaf)
            if not isinstance(out, bool | jnp.bool_):
                raise TypeError(f"`trainable` predicate must return a bool; got {out!r} for "
                                f"{path_to_str(path)!r}.")
            return bool(out)
        return jax.tree_util.tree_map_with_path(call, params)
    want = jax.tree_util.tree_structure(params)
    got = jax.tree_util.tree_structure(trainable)
    if got != want:  # type: ignore[operator]  # jaxlib ships PyTreeDef without a stub
        raise ValueError(f"`trainable` must be a tree of bools shaped like the parameters "
                         f"({want}); got {got}.")
    leaves = jax.tree_util.tree_leaves(trainable)
    if not all(isinstance(x, bool) or (hasattr(x, "dtype") and x.dtype == bool and
                                       jnp.ndim(x) == 0) for x in leaves):
        raise TypeError("`trainable` tree leaves must be Python bools (one per parameter "
                        f"array); got {[type(x).__name__ for x in leaves][:5]}.")
    return jax.tree_util.tree_map(bool, trainable)


def freeze(tx: optax.GradientTransformation, trainable: Trainable) -> optax.GradientTransformation:
    """``tx`` on the trainable leaves, a zero update on the frozen ones (partial fine-tuning).

    ``trainable`` is what :func:`trainable_mask` accepts, resolved at ``init``. Via
    ``optax.multi_transform`` with ``optax.set_to_zero()``: frozen parameters stay bit-identical
    (``θ + 0.0``; only ``-0.0`` becomes ``+0.0``) and ``tx`` never sees them (no optimiser state,
    no weight decay, not in a ``clip_by_global_norm``'s norm). Wrap the whole optimiser:
    ``freeze(make_optimizer(cfg)[0], r"^head/")`` trains only ``head`` (MEDL §7.5). Frozen
    leaves' gradients are still computed unless you differentiate only the trainable subtree
    (or use :mod:`seqjax.nn.lora`).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = freeze(optax.sgd(1.0), {"body": False, "head": True})
        >>> p = {"body": jnp.ones(2), "head": jnp.ones(2)}
        >>> u, _ = tx.update(p, tx.init(p), p)
        >>> u["body"].tolist(), u["head"].tolist()
        ([0.0, 0.0], [-1.0, -1.0])
    """
    if not isinstance(tx, optax.GradientTransformation):
        raise TypeError(f"`tx` must be an optax.GradientTransformation; got {type(tx).__name__}.")

    def labels(params: Any) -> Any:
        return jax.tree_util.tree_map(lambda m: "train" if m else "freeze",
                                      trainable_mask(params, trainable))

    return optax.multi_transform({"train": tx, "freeze": optax.set_to_zero()}, labels)


# ----------------------------------------------------------------------------- TrainState


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training, as one pytree (checkpointed as a whole).

    Attributes:
        step: int32 scalar, completed ``apply_gradients`` calls (one per optimiser update;
            gradient accumulation happens inside one step).
        params: the model parameters (float32 storage).
        opt_state: the optimiser state (float32).
        rng: a ``jax.random.PRNGKey`` (uint32[2]); split once per step for dropout.
        carry: recurrent state carried across steps by truncated BPTT, else ``None``.
        tx: the optax transformation (static, not in the pytree). ``jax.jit`` caches by it:
            build it once per run, as a new equal-looking ``tx`` recompiles the step.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> s = TrainState.create({"w": jnp.ones(2)}, optax.sgd(0.5), jax.random.PRNGKey(0))
        >>> s = s.apply_gradients({"w": jnp.ones(2)})
        >>> int(s.step), s.params["w"].tolist()
        (1, [0.5, 0.5])
    """

    step: Array
    params: Any
    opt_state: Any
    rng: Array
    carry: Any = None
    tx: optax.GradientTransformation = flax.struct.field(pytree_node=False, default=None)

    if TYPE_CHECKING:
        # flax.struct.dataclass adds it at runtime: dataclasses.replace(self, **changes).
        def replace(self, **changes: Any) -> TrainState: ...

    @classmethod
    def create(cls, params: Any, tx: optax.GradientTransformation, rng: Array,
               carry: Any = None) -> TrainState:
        """A step-0 state with ``tx.init(params)``; ``rng`` must be a raw uint32[2] key."""
        rng = jnp.asarray(rng)
        if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
            rng = jax.random.key_data(rng)
        if rng.shape != (2,) or rng.dtype != jnp.uint32:
            raise ValueError(f"`rng` must be a jax.random.PRNGKey (uint32[2]); got "
                             f"{rng.dtype}{list(rng.shape)}.")
        return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                   rng=rng, carry=carry, tx=tx)

    def apply_gradients(self, grads: Any, **changes: Any) -> TrainState:
        """One optimiser update: ``params ← params + tx.update(grads)``; ``step += 1``."""
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        params = optax.apply_updates(self.params, updates)
        return self.replace(step=self.step + 1, params=params, opt_state=opt_state, **changes)

    @property
    def num_params(self) -> int:
        """Total number of parameter scalars."""
        return count_params(self.params)
