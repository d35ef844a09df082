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
