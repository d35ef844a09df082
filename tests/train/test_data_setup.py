"""Fields built from training pairs: separate, shared vocabulary, shared tokenizer."""
from nmt.data.tokenizers import build_tokenizer
from nmt.train.data_setup import build_fields

PAIRS = [("das haus ist klein", "the house is small"), ("das haus ist gross", "the house is big"),
         ("ein kleines haus", "a small house")] * 5


def _config(**data):
    side = {"tokenizer": {"type": "bpe", "merges": 20}, "min_freq": 1, "max_size": None}
    return {"src": dict(side), "tgt": dict(side), "shared_vocab": False, "shared_tokenizer": False, **data}


def _types(field):
    return {field.vocab.itos[i] for i in range(len(field.vocab))}


def test_shared_tokenizer_has_one_model_and_a_vocabulary_per_side(tmp_path):
    src, tgt = build_fields(_config(shared_tokenizer=True), PAIRS, tmp_path)
    assert src.tokenizer is tgt.tokenizer
    joint_tokens = {tok for s, t in PAIRS for tok in src.tokenize(s) + tgt.tokenize(t)}
    src_tokens = {tok for s, _ in PAIRS for tok in src.tokenize(s)}
    tgt_tokens = {tok for _, t in PAIRS for tok in tgt.tokenize(t)}
    specials = _types(src) - src_tokens
    assert _types(src) - specials == src_tokens and _types(tgt) - specials == tgt_tokens
    assert src_tokens | tgt_tokens == joint_tokens and not (tgt_tokens <= src_tokens)
    # the one model is the one learned from both sides' text together
    joint = build_tokenizer({"type": "bpe", "merges": 20})
    joint.train([s for s, _ in PAIRS] + [t for _, t in PAIRS], None)
    assert all(tgt.tokenize(t) == joint.tokenize(t) and src.tokenize(s) == joint.tokenize(s) for s, t in PAIRS)


def test_shared_vocabulary_is_one_field(tmp_path):
    src, tgt = build_fields(_config(shared_vocab=True), PAIRS, tmp_path)
    assert src is tgt


def test_separate_tokenizers_learn_from_their_own_side(tmp_path):
    src, tgt = build_fields(_config(), PAIRS, tmp_path)
    assert src.tokenizer is not tgt.tokenizer
    assert not ({"the", "house"} & _types(src))
