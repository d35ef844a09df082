"""added_at_default: an option a checkpoint of an older nmt lacks is no difference when the new
config leaves it at its schema default (the older run behaved so)."""
import copy

from nmt.config import added_at_default, config_differences, resolve_config


def _config() -> dict:
    return resolve_config({"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}},
                           "training": {"max_steps": 1, "save_dir": "r"}}, "t.yaml")


def test_an_added_section_at_its_default_is_no_difference():
    new = _config()
    old = copy.deepcopy(new)
    del old["data"]["src"]["subword_sampling"]
    del old["data"]["tgt"]["subword_sampling"]["nbest"]
    differences = config_differences(old, new)
    assert differences == ["data.src.subword_sampling", "data.tgt.subword_sampling.nbest"]
    assert all(added_at_default(old, new, key) for key in differences)


def test_an_added_option_off_its_default_or_a_changed_one_is_a_difference():
    new = _config()
    new["data"]["src"]["subword_sampling"]["dropout"] = 0.1
    old = copy.deepcopy(new)
    del old["data"]["src"]["subword_sampling"]
    assert not added_at_default(old, new, "data.src.subword_sampling")
    old = copy.deepcopy(new)
    old["data"]["src"]["max_length"] = 7
    assert not added_at_default(old, new, "data.src.max_length")  # present in both: a change
    old["data"]["gone"] = 1
    assert not added_at_default(new, old, "data.gone")  # not in the schema


def test_resume_defaults_keep_what_a_checkpoint_before_the_option_did():
    """training.pool_sort: new runs sort pools by target length alone, a run saved before the
    option existed sorted by (target, source) and resumes so; a value set off the new default stays."""
    from nmt.config import RESUME_DEFAULTS, SCHEMA, resume_defaults

    assert SCHEMA["training"]["pool_sort"].default == "target" != RESUME_DEFAULTS["training.pool_sort"]
    new = _config()
    old = copy.deepcopy(new)
    del old["training"]["pool_sort"]
    assert resume_defaults(old, new) == ["training.pool_sort"]
    assert new["training"]["pool_sort"] == old["training"]["pool_sort"] == "target_source"
    assert config_differences(old, new) == []
    # set to another order: kept, and a difference from the checkpoint (which the trainer refuses)
    new = _config()
    new["training"]["pool_sort"] = "source_target"
    old = copy.deepcopy(new)
    del old["training"]["pool_sort"]
    assert resume_defaults(old, new) == []
    assert config_differences(old, new) == ["training.pool_sort"]
    # a checkpoint that has the key: nothing changes
    new = _config()
    old = copy.deepcopy(new)
    assert resume_defaults(old, new) == [] and new["training"]["pool_sort"] == "target"


def test_the_validation_search_keys_of_a_config_before_them_are_no_difference_at_their_defaults():
    """A checkpoint written before validation.min_length, length_penalty, length_alpha,
    coverage_penalty, beta, coverage_epsilon, stepwise_penalty and ban_unk_token existed validated
    with all of them off (their defaults), as earlier added keys (max_length_ratio,
    block_ngram_repeat); one set now is a difference (allowed on resume, and reported)."""
    keys = ("min_length", "length_penalty", "length_alpha", "coverage_penalty", "beta", "coverage_epsilon",
            "stepwise_penalty", "ban_unk_token", "max_length_ratio", "max_length_offset", "block_ngram_repeat")
    new = _config()
    old = copy.deepcopy(new)
    for key in keys:
        del old["validation"][key]
    differences = config_differences(old, new)
    assert sorted(differences) == sorted(f"validation.{key}" for key in keys)
    assert all(added_at_default(old, new, key) for key in differences)
    new["validation"].update(length_penalty="gnmt", coverage_penalty="wu", beta=0.2)
    assert [key for key in config_differences(old, new) if not added_at_default(old, new, key)] == [
        "validation.length_penalty", "validation.coverage_penalty", "validation.beta"]
