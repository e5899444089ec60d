"""Each hyperparameter is declared once, in its algorithm's config dataclass
(:mod:`algorithms.configs`): the algorithm class takes the config object and neither restates a
field as a keyword argument or default nor lists the fields again in its docstring."""

import dataclasses
import inspect
import re

import pytest

from algorithms import configs, registry

NAMES = sorted({*registry.algorithm_names(), "td3", "random"})
# The only parameters an algorithm's constructor takes besides ``self``.
NOT_HYPERPARAMETERS = ("observation_space", "action_space", "config", "device")


def _fields(name: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(configs.config_class(name))}


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _parameters(cls) -> dict[str, inspect.Parameter]:
    return {k: p for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}


@pytest.mark.parametrize("name", NAMES)
def test_constructor_takes_the_config_not_its_fields(name):
    params = _parameters(registry.algorithm_class(name))
    fields = _fields(name)
    restated = sorted(k for k in params if k in fields)
    assert not restated, f"{name}: constructor restates config fields {restated}"
    # A keyword with a default is a hyperparameter declared outside the config; one whose
    # default equals a field's default is a field restated under another name.
    defaults = {k: p.default for k, p in params.items()
                if k not in NOT_HYPERPARAMETERS and p.default is not inspect.Parameter.empty}
    restated_defaults = sorted(k for k, v in defaults.items()
                               if any(_same(v, _default(f)) for f in fields.values()))
    assert not restated_defaults, f"{name}: defaults restating config fields {restated_defaults}"
    assert not defaults, f"{name}: hyperparameters declared outside its config {sorted(defaults)}"
    assert list(params) == list(NOT_HYPERPARAMETERS), f"{name}: {list(params)}"


@pytest.mark.parametrize("name", NAMES)
def test_docstrings_do_not_list_the_config_fields(name):
    cls = registry.algorithm_class(name)
    fields = _fields(name)
    for where, doc in (("class", cls.__doc__), ("__init__", cls.__init__.__doc__)):
        listed = sorted({m.group(1) for m in re.finditer(r"^\s*(\w+):", doc or "", re.M)
                         if m.group(1) in fields})
        assert not listed, f"{name}: the {where} docstring lists config fields {listed}"


def test_the_base_class_takes_the_common_fields_from_the_config():
    from algorithms.base import RLAlgorithm

    common = {"encoder", "image_layout", "data_transformers", "precision", "max_grad_norm"}
    params = _parameters(RLAlgorithm)
    assert not sorted(k for k in params if k in common)


def _same(a, b) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return list(a) == list(b)
    return type(a) is type(b) and a == b
