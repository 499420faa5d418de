import dataclasses

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from conftest import REPO

from app.config import ConfigError, Settings, key_specs, parse_settings
from app.reference import DOC, METHODS_BEGIN, METHODS_DOC, METHODS_END, documented, methods_table, reference
from app.registry import CONTRACTS, METHODS
from strategies.base import FederatedStrategy
from strategies.contracts.common import SHARED_GROUPS, TrainingSettings
from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.keys import key


def pyproject_config():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_pyproject_holds_every_declared_key_with_its_default():
    config, specs = pyproject_config(), key_specs()
    assert set(config) == set(specs)
    for name, (_, spec) in specs.items():
        assert config[name] == spec.default and type(config[name]) is spec.kind, name


def test_pyproject_defaults_parse_to_the_declared_defaults():
    settings = parse_settings(pyproject_config())
    assert settings == parse_settings({})
    assert settings.training == TrainingSettings() and settings.run.strategy == "perfedavg"


def test_the_configuration_reference_is_generated_from_the_declarations():
    assert documented(DOC.read_text()) == reference(), "run: python -m app.reference --write"


def test_the_own_app_pages_table_of_methods_is_generated_from_the_registry():
    page = METHODS_DOC.read_text()
    assert documented(page, METHODS_BEGIN, METHODS_END) == methods_table(), "run: python -m app.reference --write"


def test_every_key_is_declared_once_and_every_method_key_carries_its_prefix():
    specs = key_specs()
    for name, contract in CONTRACTS.items():
        for spec in contract.settings.key_specs():
            assert spec.name.startswith(f"{name}-") and specs[spec.name][0] is contract.settings
        assert set(contract.uses) <= {s.name for s in TrainingSettings.key_specs()}, name
    shared = [spec.name for group in SHARED_GROUPS for spec in group.key_specs()]
    assert len(shared) == len(set(shared))


def test_a_key_declared_twice_or_without_its_prefix_is_refused():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Clash(MethodSettings):
        prefix = "perfedavg"  # collides with Per-FedAvg's own keys
        alpha: float = key(0.1, "a second perfedavg-alpha")

    clash = Contract(name="perfedavg", summary="", settings=Clash, uses=())
    with pytest.raises(ValueError, match="'perfedavg-alpha' is declared by both PerFedAvgSettings and Clash"):
        key_specs({**CONTRACTS, "clash": clash})
    with pytest.raises(ValueError, match="prefix is 'perfedavg', not 'other'"):
        Contract(name="other", summary="", settings=Clash, uses=())


def test_every_method_has_a_row_in_the_readme_and_a_page_in_the_docs():
    readme = (REPO / "README.md").read_text()
    for name in METHODS:
        assert f"\n| `{name}` | " in readme, f"README's table of methods lacks {name}"
        assert (REPO / "docs" / "methods" / f"{name}.md").is_file(), f"docs/methods/{name}.md is missing"


def test_strategy_and_client_of_every_method_share_its_contract_and_its_example_parses():
    for name, method in METHODS.items():
        assert method.contract is method.client.contract is CONTRACTS[name]
        assert method.server.contract is method.contract or method.server is FederatedStrategy
        assert parse_settings(method.contract.example).run.strategy == name


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("strategy", "fedprocs", "perfedavg"),
        ("perfedavg-variant", "sgd", "hf"),
        ("aggregation", "medoid", "median"),
        ("dataset", "imagenet", "mnist-5k"),
        ("partitioner", "random", "dirichlet"),
        ("model", "resnet", "mlp"),
        ("device", "tpu", "cuda"),
        ("paper-variant", "odd", "diff-hetero"),
        ("emnist-split", "weird", "balanced"),
        ("diffusion-graph", "tree", "ring"),
        ("fathom-local-term", "other", "cosine"),
    ],
)
def test_unknown_names_list_the_allowed_values(key, value, allowed):
    with pytest.raises(ConfigError) as err:
        parse_settings({key: value})
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
        ("lr", float("nan")),
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
        ("perfedavg-alpha", -0.1),
        ("perfedavg-beta", 0.0),
        ("perfedavg-delta", 0.0),
        ("perfedavg-outer-batch-size", 0),
        ("perfedavg-hessian-batch-size", 0),
        ("fathom-gamma-lr", -1.0),
        ("fathom-smoothing", 1.0),
        ("fathom-batch-min", 0.5),
        ("diffusion-mu", 0.0),
        ("diffusion-participation", 0.0),
        ("diffusion-participation", 1.5),
        ("diffusion-neighbour-probability", -0.1),
    ],
)
def test_out_of_range_values_name_the_key_and_range(key, value):
    with pytest.raises(ConfigError, match=rf"'{key}': {value!r} is outside [\[(]"):
        parse_settings({key: value})


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [("local-steps", 2.5, "an integer"), ("lr", "fast", "a number"), ("download", 1, "a boolean"),
     ("dataset", 3, "a string"), ("perfedavg-alpha", True, "a number")],
)  # fmt: skip
def test_wrong_types_are_refused(key, value, kind):
    with pytest.raises(ConfigError, match=rf"'{key}': .* is not {kind}"):
        parse_settings({key: value})


def test_integral_floats_are_accepted_for_int_keys_and_ints_for_float_keys():
    settings = parse_settings({"local-steps": 4.0, "lr": 1})
    assert settings.training.local_steps == 4 and settings.training.lr == 1.0
    assert type(settings.training.local_steps) is int and type(settings.training.lr) is float


def test_a_fit_config_may_send_a_real_batch_size_and_the_client_takes_the_nearest_integer():
    training = TrainingSettings().updated({"batch-size": 7.6, "lr": 0.2, "server-round": 3, "unknown": 1})
    assert training.batch_size == 8 and training.lr == 0.2
    with pytest.raises(ConfigError, match="'batch-size': 0 is outside"):
        TrainingSettings().updated({"batch-size": 0.4})


def test_unknown_key_is_refused_with_the_nearest_known_ones():
    with pytest.raises(ConfigError, match=r"unknown run config key\(s\) 'learning-rate'; known keys"):
        parse_settings({"learning-rate": 0.1})
    # every key that is a method's key of that name, whichever methods are registered
    with pytest.raises(ConfigError, match=r"'alpha' \(did you mean [^)]*'perfedavg-alpha'[^)]*\?\)"):
        parse_settings({"alpha": 0.1})
    with pytest.raises(ConfigError, match=r"'mu' \(did you mean [^)]*'diffusion-mu'[^)]*\?\)"):
        parse_settings({"mu": 0.1})
    with pytest.raises(ConfigError, match=r"'lrr' \(did you mean 'lr'\?\)"):
        parse_settings({"lrr": 0.1})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"dataset": "femnist"}, "'data-dir' must be set for dataset 'femnist'"),
        ({"partitioner": "natural"}, "'natural' needs a dataset with users"),
        ({"images-per-class": 7}, "'images-per-class': 7 must be even"),
        ({"dataset": "synthetic", "partitioner": "natural", "model": "cnn"}, "'model': 'cnn' needs images"),
        ({"dataset": "least-squares", "partitioner": "natural"},
         "real targets (['least-squares']) need a regression model ('linear')"),
        ({"central-eval": True, "dataset": "synthetic", "partitioner": "natural", "model": "logreg"},
         "'central-eval': needs a dataset with its own test set"),
        ({"strategy": "fathom"}, "'local-epochs': fathom starts at 0.0, outside its bounds [0.01, 10.0]"),
        ({"fathom-lr-min": 0.5, "fathom-lr-max": 0.1}, "'fathom-lr-min': 0.5 is above 'fathom-lr-max' = 0.1"),
        ({"strategy": "diffusion", "preflight": False}, "'preflight': diffusion needs it"),
        ({"diffusion-graph": "file"}, "'diffusion-graph-file' is set exactly when 'diffusion-graph' is 'file'"),
        ({"diffusion-mode": "fedsgd", "diffusion-participation": 0.5}, "'fedsgd' has every agent take part"),
    ],
)  # fmt: skip
def test_inconsistent_combinations(config, message):
    with pytest.raises(ConfigError) as err:
        parse_settings(config)
    assert message in str(err.value)


def test_settings_are_frozen():
    settings = parse_settings({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.training.lr = 1.0
    assert isinstance(settings, Settings)
