"""--key=value overrides onto frozen dataclass configs: types, nesting and clear errors."""

import dataclasses
from typing import Literal

import pytest

from seqjax.experiments._config import (
    ConfigError,
    apply_overrides,
    config_from_dict,
    parse_overrides,
)


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = 1e-3
    schedule: Literal["constant", "cosine"] = "constant"


@dataclasses.dataclass(frozen=True)
class Cfg:
    hidden: int = 8
    rate: float | None = None
    name: str = "x"
    shuffle: bool = False
    sizes: tuple[int, ...] = (1, 2)
    optim: Optim = Optim()


def test_parse_overrides_forms():
    got = parse_overrides(["--hidden=32", "--learning-rate", "0.1", "--shuffle", "--name", "a=b"])
    assert got == {"hidden": "32", "learning_rate": "0.1", "shuffle": True, "name": "a=b"}
    with pytest.raises(ConfigError, match="expected --key=value"):
        parse_overrides(["hidden=3"])


def test_apply_overrides_converts_types():
    cfg = apply_overrides(Cfg(), {"hidden": "32", "rate": "0.5", "shuffle": "true",
                                  "sizes": "3,4,5", "optim.lr": "1e-2",
                                  "optim.schedule": "cosine", "name": "run-1"})
    assert cfg == Cfg(32, 0.5, "run-1", True, (3, 4, 5), Optim(0.01, "cosine"))
    assert apply_overrides(cfg, {"rate": "none", "shuffle": True}).rate is None
    assert apply_overrides(Cfg(), {"hidden": 7}).hidden == 7


@pytest.mark.parametrize("overrides, message", [
    ({"hiden": "3"}, r"unknown config key --hiden for Cfg\. Did you mean --hidden\?"),
    ({"hidden": "abc"}, r"--hidden: expected int; got 'abc'"),
    ({"hidden": "2.5"}, r"--hidden: expected int"),
    ({"rate": "fast"}, r"--rate: expected"),
    ({"shuffle": "maybe"}, r"--shuffle: expected bool"),
    ({"sizes": "1,x"}, r"--sizes: expected int"),
    ({"hidden": True}, r"--hidden needs a value"),
    ({"optim.schedule": "linear"}, r"--optim.schedule: expected one of \['constant', 'cosine'\]"),
    ({"optim.lrr": "1"}, r"unknown config key --optim.lrr .*Did you mean --optim.lr\?"),
    ({"name.x": "1"}, r"--name is not a nested config"),
])
def test_bad_overrides_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(Cfg(), overrides)


def test_config_from_dict_round_trip():
    cfg = Cfg(hidden=3, sizes=(7,), optim=Optim(0.5))
    assert config_from_dict(Cfg, dataclasses.asdict(cfg)) == cfg
    with pytest.raises(ConfigError, match="unknown config key --extra"):
        config_from_dict(Cfg, {"extra": 1})


def test_saved_config_reads_old_names_into_todays_groups():
    """A saved config in today's names: an option renamed twice (``d_model`` -> ``embed_dim``
    -> ``model.embed_dim``), gpt2's ``"model": "lstm"`` (now ``model.architecture``), and a
    key saved under the new name wins over the old one; unknown keys are kept (for
    ``config_from_dict`` to refuse)."""
    from seqjax.experiments import gpt2, selective_copying
    from seqjax.experiments._config import saved_config

    assert saved_config(selective_copying.Config, {"d_model": 64, "steps": 3, "x": 1}) == \
        {"steps": 3, "x": 1, "model": {"embed_dim": 64}}
    assert saved_config(gpt2.Config, {"model": "lstm", "num_layers": 2, "data": "d"}) == \
        {"model": {"architecture": "lstm", "num_layers": 2}, "data_path": "d"}
    assert saved_config(gpt2.Config, {"model": {"num_layers": 3}, "num_layers": 2,
                                      "data": "old", "data_path": "new"}) == \
        {"model": {"num_layers": 3}, "data_path": "new"}
