"""TrainOptions: one declaration of the training options the recipes share, one meaning of off."""

import dataclasses
import types
import typing

import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.experiments._config import _hints, field_range
from seqjax.experiments._runner import list_experiments, load_experiment
from seqjax.train import OptimizerConfig, ParallelOptions, TrainOptions, make_optimizer

TRAIN = _hints(TrainOptions)


def _configs() -> list[tuple[str, type]]:
    return [(name, load_experiment(name).Config) for name in list_experiments()]


def _optional_of(tp: object, base: object) -> bool:
    args = typing.get_args(tp)
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and \
        set(args) == {base, type(None)}


def test_train_options_are_the_shared_schedule_with_declared_ranges():
    assert [f.name for f in dataclasses.fields(TrainOptions)] == [
        "steps", "batch_size", "learning_rate", "warmup_steps", "clip_norm", "log_every"]
    for name, tp in TRAIN.items():
        assert field_range(tp)[1] is not None, name  # every option has its range
    assert TrainOptions().clip_norm == 1.0 and dataclasses.is_dataclass(TrainOptions)


@pytest.mark.parametrize("name, cls", _configs(), ids=[n for n, _ in _configs()])
def test_a_recipe_spells_each_training_option_with_the_shared_type(name, cls):
    """Every recipe's field named as a TrainOptions field has its type (``X | None`` where
    the recipe derives an unset value: per-task or per-epoch step counts); a recipe that has
    all of them inherits them rather than declaring its own."""
    hints = _hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    for option, tp in TRAIN.items():
        if option in fields:
            assert hints[option] == tp or _optional_of(hints[option], tp), (name, option)
    if set(TRAIN) <= fields:
        assert issubclass(cls, TrainOptions), name
    if issubclass(cls, TrainOptions):
        assert issubclass(cls, ParallelOptions), name


def test_most_training_recipes_inherit_train_options():
    inheriting = {n for n, cls in _configs() if issubclass(cls, TrainOptions)}
    assert {"audio", "baselines", "char_lm", "digits", "forecasting", "gpt2", "image_gpt",
            "numbers", "text_to_image", "translation"} <= inheriting


def test_no_recipe_keeps_a_retired_spelling_of_a_training_option():
    retired = {"hidden", "warmup", "transformer_layers", "num_steps", "batch", "lr"}
    for name, cls in _configs():
        assert not retired & {f.name for f in dataclasses.fields(cls)}, name


def test_clip_norm_off_is_zero_never_none():
    with pytest.raises(ValueError, match=r"`clip_norm` must be >= 0 \(0 = no clipping\)"):
        OptimizerConfig(name="sgd", learning_rate=1.0, clip_norm=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clip_norm"):
        OptimizerConfig(name="sgd", learning_rate=1.0, clip_norm=-1.0)
    params = {"w": jnp.zeros(3)}
    g = {"w": jnp.array([30.0, 40.0, 0.0])}  # ‖g‖ = 50
    for clip, want in ((0.0, [-30.0, -40.0, 0.0]), (5.0, [-3.0, -4.0, 0.0])):
        tx, _ = make_optimizer(OptimizerConfig(name="sgd", learning_rate=1.0, clip_norm=clip))
        updates, _ = tx.update(g, tx.init(params), params)
        np.testing.assert_allclose(updates["w"], want, rtol=1e-6)


def test_ptb_lm_clip_norm_zero_is_no_clipping_too():
    from seqjax.experiments import ptb_lm

    params = {"w": jnp.zeros(2)}
    g = {"w": jnp.array([3.0, 4.0])}
    cfg = ptb_lm.Config(clip_norm=0.0, sum_over_time=False, learning_rate=0.5)
    tx, _ = ptb_lm.make_tx(cfg, steps_per_epoch=10)
    updates, _ = tx.update(g, tx.init(params), params)
    np.testing.assert_allclose(updates["w"], [-1.5, -2.0])


def test_unset_steps_of_ptb_lm_means_every_epoch_and_zero_means_none():
    from seqjax.experiments import ptb_lm

    assert ptb_lm.Config().steps is None  # all epochs
    assert ptb_lm.Config(steps=0).steps == 0  # no training, as everywhere else


def test_a_config_saved_with_none_for_off_reads_as_zero():
    """gpt2 saved ``clip_norm: null`` (no clipping) before 0 became the one off."""
    from seqjax.experiments import gpt2
    from seqjax.experiments._config import ConfigError, config_from_dict

    assert config_from_dict(gpt2.Config, {"clip_norm": None}).clip_norm == 0
    assert config_from_dict(gpt2.Config, {"prefetch": None}).prefetch is None  # unset stays
    with pytest.raises(ConfigError, match="batch_size"):
        config_from_dict(gpt2.Config, {"batch_size": None})  # no off: still refused


def test_the_training_options_build_the_optimizer_and_fit_configs_in_one_place():
    """``optimizer_config``/``fit_config`` hand down every field the config shares by name
    with OptimizerConfig/FitConfig, the recipes' one schedule, then the call's overrides."""
    from seqjax.experiments import gpt2

    cfg = gpt2.Config(steps=50, warmup_steps=10, learning_rate=2e-3, min_lr_ratio=0.1,
                      beta1=0.8, beta2=0.99, weight_decay=0.05, clip_norm=0.5,
                      flat_optimizer=False, momentum=0.9, ns_steps=3, eval_every=5,
                      checkpoint_every=25, log_every=5, steps_per_call=5, prefetch=1,
                      progress=False)
    opt = cfg.optimizer_config("adamw", weight_decay=0.0)
    assert (opt.name, opt.schedule, opt.steps, opt.warmup_steps, opt.learning_rate,
            opt.min_lr_ratio, opt.beta1, opt.beta2, opt.clip_norm, opt.flat_optimizer) == (
        "adamw", "warmup_cosine", 50, 10, 2e-3, 0.1, 0.8, 0.99, 0.5, False)
    assert opt.weight_decay == 0.0  # the override wins
    assert opt.momentum is None and opt.ns_steps == 5  # Muon's options go to Muon alone
    muon = cfg.optimizer_config("muon")
    assert (muon.momentum, muon.ns_steps, muon.weight_decay) == (0.9, 3, 0.05)
    # A run no longer than its warm-up stops inside it (nanoGPT's and llm.c's rule).
    assert dataclasses.replace(cfg, steps=4).optimizer_config().steps == 11
    fit = cfg.fit_config(print_logs=True)
    assert (fit.steps, fit.log_every, fit.eval_every, fit.checkpoint_every, fit.steps_per_call,
            fit.prefetch, fit.progress, fit.print_logs) == (50, 5, 5, 25, 5, 1, False, True)
