import dataclasses

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from conftest import REPO

from app.config import FIELDS, ConfigError, Settings, parse_settings
from app.registry import STRATEGY_NAMES


def pyproject_config():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_pyproject_holds_every_key_with_the_settings_default():
    config = pyproject_config()
    assert set(config) == set(FIELDS)
    defaults = Settings()
    for key, field in FIELDS.items():
        assert config[key] == getattr(defaults, field.name), key


def test_pyproject_defaults_parse():
    settings = parse_settings(pyproject_config(), STRATEGY_NAMES)
    assert settings == Settings()
    assert settings.client_settings().lr == settings.lr


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("strategy", "fedprox", "perfedavg"),
        ("variant", "sgd", "hf"),
        ("aggregation", "median", "uniform"),
        ("dataset", "imagenet", "mnist-5k"),
        ("partitioner", "random", "dirichlet"),
        ("model", "resnet", "mlp"),
        ("device", "tpu", "cuda"),
        ("paper-variant", "odd", "diff-hetero"),
        ("emnist-split", "weird", "balanced"),
    ],
)
def test_unknown_names_list_the_allowed_values(key, value, allowed):
    with pytest.raises(ConfigError) as err:
        parse_settings({key: value}, STRATEGY_NAMES)
    message = str(err.value)
    assert repr(key) in message and repr(value) in message and allowed in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num-server-rounds", 0),
        ("fraction-fit", 0.0),
        ("fraction-fit", 1.5),
        ("fraction-evaluate", -0.1),
        ("min-fit-clients", 0),
        ("eval-every", 0),
        ("lr", 0.0),
        ("lr", -1.0),
        ("local-steps", 0),
        ("local-epochs", -1.0),
        ("batch-size", 0),
        ("adapt-steps", -1),
        ("adapt-lr", -0.1),
        ("adapt-batch-size", -1),
        ("images-per-class", 0),
        ("dirichlet-concentration", 0.0),
        ("classes-per-client", 0),
        ("test-fraction", 1.0),
        ("synthetic-alpha", -1.0),
        ("num-threads", -1),
        ("seed", -1),
        ("alpha", -0.1),
        ("beta", 0.0),
        ("delta", 0.0),
        ("outer-batch-size", 0),
        ("hessian-batch-size", 0),
    ],
)
def test_out_of_range_values_name_the_key_and_range(key, value):
    with pytest.raises(ConfigError, match=rf"'{key}': {value!r} is outside [\[(]"):
        parse_settings({key: value}, STRATEGY_NAMES)


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [("local-steps", 2.5, "int"), ("lr", "fast", "float"), ("download", 1, "bool"), ("dataset", 3, "str")],
)
def test_wrong_types_are_refused(key, value, kind):
    with pytest.raises(ConfigError, match=rf"'{key}': .* is not a {kind}"):
        parse_settings({key: value}, STRATEGY_NAMES)


def test_integral_floats_are_accepted_for_int_keys():
    assert parse_settings({"local-steps": 4.0}, STRATEGY_NAMES).local_steps == 4


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match=r"unknown run config key\(s\) \['learning-rate'\]"):
        parse_settings({"learning-rate": 0.1}, STRATEGY_NAMES)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"dataset": "femnist"}, "'data-dir' must be set for dataset 'femnist'"),
        ({"partitioner": "natural"}, "'natural' needs a dataset with users"),
        ({"images-per-class": 7}, "'images-per-class': 7 must be even"),
        ({"dataset": "synthetic", "partitioner": "natural", "model": "cnn"}, "'model': 'cnn' needs images"),
    ],
)
def test_inconsistent_combinations(config, message):
    with pytest.raises(ConfigError, match=message):
        parse_settings(config, STRATEGY_NAMES)


def test_settings_are_frozen():
    settings = parse_settings({}, STRATEGY_NAMES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lr = 1.0


def test_readme_documents_every_key_with_its_default():
    readme = (REPO / "README.md").read_text()
    for key, value in pyproject_config().items():
        shown = f'"{value}"' if isinstance(value, str) else str(value).lower()
        assert f"| `{key}` | `{shown}` |" in readme, key
