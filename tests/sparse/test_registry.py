"""Registry: names -> bound mappings / losses; clear errors; lazy structured mappings."""
import importlib.util
import inspect

import pytest
import torch

import nmt.sparse as S
from nmt.sparse import (
    LOSS_NAMES,
    MAPPING_NAMES,
    check_loss,
    check_mapping,
    get_loss,
    get_mapping,
    is_softmax,
    loss_display_name,
    loss_parameters,
    mapping_function,
    mapping_parameters,
)

HAS_STRUCTURED = importlib.util.find_spec("nmt.sparse.structured") is not None


def test_names():
    assert set(MAPPING_NAMES) == {"softmax", "sparsemax", "entmax15", "entmax_bisect", "fusedmax", "oscarmax"}
    assert set(LOSS_NAMES) == {"softmax", "sparsemax", "entmax15", "entmax_bisect"}


@pytest.mark.parametrize("name,fn", [("softmax", S.softmax), ("sparsemax", S.sparsemax),
                                     ("entmax15", S.entmax15), ("entmax_bisect", S.entmax_bisect)])
def test_get_mapping_calls_the_function(name, fn):
    x = torch.randn(3, 4, 5)
    mask = torch.rand(3, 4, 5) > 0.3
    f = get_mapping(name)
    assert torch.equal(f(x, dim=1, mask=mask), fn(x, dim=1, mask=mask))
    assert torch.equal(f(x, 1, mask), fn(x, dim=1, mask=mask))  # the contract's positional order
    assert mapping_function(name) is fn


def test_params_are_bound():
    x = torch.randn(4, 7, dtype=torch.float64)
    f = get_mapping("entmax_bisect", alpha=2.0, n_iter=80)
    assert torch.allclose(f(x), S.sparsemax(x), atol=1e-10)
    assert torch.allclose(f(x.T, 0), S.sparsemax(x.T, dim=0), atol=1e-10)
    loss = get_loss("entmax_bisect", alpha=1.5)
    t = torch.tensor([0, 1, 2, -1])
    assert torch.allclose(loss(x, t, -1, "sum"), S.entmax15_loss(x, t, ignore_index=-1, reduction="sum"),
                          atol=1e-10)
    t = t.abs()
    assert torch.equal(get_loss("softmax")(x, t, reduction="sum"), S.cross_entropy_loss(x, t, reduction="sum"))


def test_signatures_for_config_validation():
    params = inspect.signature(mapping_function("entmax_bisect")).parameters
    assert {"alpha", "n_iter"} <= set(params)


def test_unknown_name_lists_valid_and_suggests():
    valid = "valid: softmax, sparsemax, entmax15, entmax_bisect, fusedmax, oscarmax"
    with pytest.raises(ValueError, match=f"'entmax_15'.*did you mean 'entmax15'.*{valid}"):
        get_mapping("entmax_15")
    with pytest.raises(ValueError, match="valid: softmax, sparsemax, entmax15, entmax_bisect$"):
        get_loss("sparsmax")


def test_unknown_parameter():
    with pytest.raises(ValueError, match="'beta'.*entmax_bisect.*valid: alpha, n_iter"):
        get_mapping("entmax_bisect", beta=1.0)
    with pytest.raises(ValueError, match="'alpha'.*sparsemax.*valid: impl"):
        get_mapping("sparsemax", alpha=2.0)
    with pytest.raises(ValueError, match="'lam'"):
        get_loss("entmax15", lam=0.1)


@pytest.mark.parametrize("name", ["fusedmax", "oscarmax"])
def test_structured_have_no_loss(name):
    with pytest.raises(ValueError, match="no Fenchel-Young loss"):
        get_loss(name)


@pytest.mark.parametrize("name", ["fusedmax", "oscarmax"])
def test_structured_resolve_lazily(name):
    if HAS_STRUCTURED:
        f = get_mapping(name, lam=0.1, gamma=1.0)
        p = f(torch.randn(2, 6), dim=-1)
        assert torch.allclose(p.sum(-1), torch.ones(2), atol=1e-5)
    else:
        with pytest.raises(ValueError, match=f"mapping '{name}' is unavailable"):
            get_mapping(name)


def test_bad_values_fail_at_lookup():
    with pytest.raises(ValueError, match="'alpha'.*>= 1"):
        get_mapping("entmax_bisect", alpha=0.5)
    with pytest.raises(ValueError, match="'alpha'.*>= 1"):
        get_loss("entmax_bisect", alpha="1.5")
    with pytest.raises(ValueError, match="'alpha'.*finite"):
        get_mapping("entmax_bisect", alpha=float("inf"))
    with pytest.raises(ValueError, match="'alpha'.*finite"):
        get_loss("entmax_bisect", alpha=float("inf"))
    with pytest.raises(ValueError, match="'n_iter'"):
        get_mapping("entmax_bisect", n_iter=0)
    f = get_mapping("entmax_bisect", alpha=torch.tensor([[1.2], [1.7]]))
    assert torch.allclose(f(torch.randn(2, 5)).sum(-1), torch.ones(2))


def test_one_signature_rule_for_mappings_and_losses():
    # the inputs (first positional parameter(s), whatever their names) are never parameters
    assert mapping_parameters("entmax_bisect") == ["alpha", "n_iter", "impl"]
    assert mapping_parameters("softmax") == []
    if HAS_STRUCTURED:
        assert mapping_parameters("fusedmax") == ["lam", "gamma", "impl"]
        with pytest.raises(ValueError, match="unknown parameter 'x' of mapping 'fusedmax'"):
            check_mapping("fusedmax", {"x": 1.0})
    assert "alpha" in loss_parameters("entmax_bisect") and "target" not in loss_parameters("entmax_bisect")
    with pytest.raises(ValueError, match="unknown parameter 'target' of loss 'sparsemax'"):
        check_loss("sparsemax", {"target": 1})
    with pytest.raises(ValueError, match="unknown mapping 'spasemax'"):
        check_mapping("spasemax", {})


def test_name_facts():
    assert is_softmax("softmax") and not any(is_softmax(n) for n in MAPPING_NAMES if n != "softmax")
    assert loss_display_name("softmax") == "cross-entropy"
    assert loss_display_name("entmax15") == "entmax15 Fenchel-Young loss"
