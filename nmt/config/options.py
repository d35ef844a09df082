"""The schema of an nmt YAML config: every section, key, type and default.

``configs/reference.yaml`` documents the same options with comments; a test checks that
the two agree (every schema key appears in the reference config and vice versa).

An option added to an existing section must default to the behaviour nmt had before it: a
checkpoint written earlier lacks the key, and its resume counts the key at its default as no
difference (``nmt.config.added_at_default``); a new option whose default changed what training
does would be resumed over silently. The one way around it is :data:`RESUME_DEFAULTS`: an option
whose default for new runs differs from what nmt did before it names there the old behaviour,
which a resume of a checkpoint lacking the key keeps (``nmt.config.resume_defaults``).
"""
from __future__ import annotations

from nmt.config.schema import REQUIRED, ListableSection, Option

METRICS = ("exact_match", "bleu", "chrf", "ter", "loss", "accuracy", "aer")
DECODING_METRICS = ("exact_match", "bleu", "chrf", "ter")
"""The metrics of the decoded validation set (``validation.metrics`` chooses among them)."""
HIGHER_IS_BETTER = {"exact_match": True, "bleu": True, "chrf": True, "ter": False, "accuracy": True, "loss": False,
                    "aer": False}


def _side(default_tokenizer: str) -> dict:
    return {
        "tokenizer": Option(dict, {"type": default_tokenizer},
                            "tokenizer settings: {type: char|space|bpe|sentencepiece, ...type-specific keys}"),
        "min_freq": Option(int, 1, "drop tokens seen fewer times from the vocabulary", minimum=1),
        "max_size": Option(int, None, "keep at most this many tokens (plus specials)", nullable=True, minimum=1),
        "max_length": Option(int, 50, "skip training pairs longer than this (in tokens)", minimum=1),
        "min_length": Option(int, 1, "skip training pairs shorter than this (in tokens; 1: only empty lines, "
                             "which are always skipped; Moses clean-corpus-n's min)", minimum=1),
        "vocab_file": Option(str, None, "read the vocabulary from this file instead of building it from the data: "
                             "one token per line, optionally followed by whitespace and a count (OpenNMT-py "
                             "'token<TAB>count', fairseq 'token count'); min_freq / max_size apply (min_freq needs "
                             "counts); with shared_vocab the src file serves both sides", nullable=True),
        "subword_sampling": {
            "alpha": Option(float, None, "sentencepiece (unigram): sample each epoch's training segmentation with "
                            "this smoothing: probability ~ exp(alpha x score) (enable_sampling); null: off",
                            nullable=True, minimum=0),
            "nbest": Option(int, -1, "sentencepiece: sample among the nbest best segmentations (-1: all of them; "
                            "at most 512, sentencepiece's n-best limit)", minimum=-1, maximum=512),
            "dropout": Option(float, 0.0, "bpe: BPE-dropout probability of each epoch's training segmentation "
                              "(0: off)", minimum=0, maximum=1, max_inclusive=False),
            "vocab_samples": Option(int, 0, "the vocabulary also counts the sampled segmentations of the first N "
                                    "training epochs (as training draws them), summed with the deterministic counts "
                                    "before min_freq / max_size; 0: the deterministic segmentation only", minimum=0),
        },
    }


def _files(required: bool) -> dict:
    default = REQUIRED if required else None
    return {
        "src": Option(str, default, "source-side text file, one sentence per line", nullable=not required),
        "tgt": Option(str, default, "target-side text file, aligned line by line", nullable=not required),
    }


def _corpus() -> ListableSection:
    return ListableSection(
        _files(required=True),
        weight=Option(float, 1.0, "each epoch holds this corpus's kept pairs weight times: floor(weight) copies plus "
                      "a random frac(weight) share of them, drawn from (training.seed, epoch, corpus); < 1 subsamples",
                      minimum=0, min_inclusive=False),
        name=Option(str, None, "the corpus's name in the data log (null: its files)", nullable=True),
        src_tag=_src_tag("this corpus's"),
        align=Option(str, None, "reference word alignments of this corpus's pairs for training.guided_alignment: one "
                     "line per pair, Pharaoh format 'i-j' (source word i, target word j, 0-based, whitespace-"
                     "separated words of the lines; fast_align / eflomal output); null: no alignment loss on "
                     "this corpus", nullable=True),
        noise={
            "delete": Option(float, 0.0, "noise on this corpus's training sources, anew every epoch (noised "
                             "back-translation, Edunov et al. 2018: delete 0.1, blank 0.1, shuffle 3): delete each "
                             "word with this probability (one word always remains; a word: a sentencepiece piece "
                             "starting with the word marker and the pieces after it, a BPE run of pieces ending in "
                             "the separator and the piece after them, a space tokenizer's token, a char "
                             "tokenizer's character; a src_tag is never noised)", minimum=0, maximum=1,
                             max_inclusive=False),
            "blank": Option(float, 0.0, "replace each word (kept) by one <unk> with this probability", minimum=0,
                            maximum=1, max_inclusive=False),
            "shuffle": Option(int, 0, "move words by a random permutation that takes none more than this many "
                              "places (word i sorts by i + U(0, k + 1)); 0: order kept", minimum=0),
        },
    )


def _src_tag(whose: str) -> Option:
    return Option(str, None, f"a token put before each of {whose} source sentences after tokenization (never "
                  "cut by a tokenizer; always in the source vocabulary), e.g. <BT> for tagged back-translation or "
                  "<2de> for a multilingual model (nmt-translate -src_tag); it counts toward the source length; "
                  "null: none", nullable=True)


EXTRA_VALID = {
    "name": Option(str, REQUIRED, "the set's name in the logs, metrics.jsonl (valid_<name>_bleu) and TensorBoard"),
    **_files(required=True),
    "src_tag": _src_tag("this set's"),
}
"""One entry of ``data.extra_valid`` (checked by :func:`nmt.config.validation.check_extra_valid`)."""


DATA = {
    "generate": Option(str, None, "generate the data files if missing: 'quickstart' (synthetic inflection task)",
                       choices=("quickstart",), nullable=True),
    "generate_seed": Option(int, 1234, "seed of the generated data"),
    "train": _corpus(),  # one {src, tgt, weight, name, src_tag} or a list of them (several corpora)
    "valid": {**_files(required=True), "src_tag": _src_tag("the validation"),
              "align": Option(str, None, "reference word alignments of the validation pairs (Pharaoh, as "
                              "data.train.align): every validation then reports the alignment error rate (aer) of "
                              "the alignment attention's most attended source word per target word; null: none",
                              nullable=True)},
    "extra_valid": Option(list, [], "more validation sets, monitored only (e.g. one per direction of a multilingual "
                          "model): a list of {name, src, tgt, src_tag}; each validation also scores them (the same "
                          "figures as data.valid's, logged as valid_<name>_<figure>); early stopping, the lr "
                          "schedule and best.pt follow data.valid alone"),
    "src": _side("space"),
    "tgt": _side("space"),
    "max_length_ratio": Option(float, None, "skip training pairs whose longer side has more than this many times "
                               "the tokens of the shorter (after the tokenizer; Moses clean-corpus-n -ratio, 9 there); "
                               "null or 0: off, else >= 1", nullable=True, minimum=0),
    "sampling_temperature": Option(float, 1.0, "several corpora: each takes a share of an epoch proportional to "
                                   "(weight x kept pairs)^(1/T), the epoch as large as at T = 1 (multilingual "
                                   "temperature sampling; 1: the weights as given, 5: small corpora up, large ones "
                                   "down)", minimum=0, min_inclusive=False),
    "shared_vocab": Option(bool, False, "one tokenizer and vocabulary for both sides (built from the src settings)"),
    "shared_tokenizer": Option(bool, False, "one tokenizer trained on both sides (src settings), a vocabulary "
                               "per side of the tokens that side uses (a joint sentencepiece/BPE model)"),
    "id_cache": Option(bool, False, "keep the encoded training data as flat token-id arrays cached next to the "
                       "data and memory-mapped (large corpora; shared by the processes of a node)"),
}

MAX_SIZE = 1 << 16
"""Largest embedding / hidden size accepted (an LSTM layer of this size holds 2^34 weights)."""
MAX_LAYERS = 256
"""Most encoder / decoder layers accepted."""


def _attention_kind(kind: str) -> dict:
    return {
        "mapping": Option(str, None, f"{kind} mapping of the Transformer (null: model.attention.mapping)",
                          nullable=True),
        "params": Option(dict, None, f"{kind} mapping parameters, e.g. {{alpha: learned}} for entmax_bisect "
                         "(null: model.attention.params when the mapping is inherited, else none)", nullable=True),
    }


MODEL = {
    "type": Option(str, "rnn", "model architecture: rnn (encoder/decoder sections) or transformer (transformer "
                   "section)", choices=("rnn", "transformer")),
    "embeddings": {
        "src_size": Option(int, 256, "source embedding size", minimum=1, maximum=MAX_SIZE),
        "tgt_size": Option(int, 256, "target embedding size", minimum=1, maximum=MAX_SIZE),
        "share": Option(bool, False, "share source and target embeddings (needs data.shared_vocab)"),
        "tie_output": Option(bool, False, "tie the output layer to the target embeddings"),
        "dropout": Option(float, 0.3, "dropout on embeddings", minimum=0.0, maximum=1.0, max_inclusive=False),
        "src_word_dropout": Option(float, 0.0, "whole-word dropout on the source in training: each token's "
                                   "embedding zeroed with this probability, the others scaled by 1 / (1 - p) "
                                   "(Nematus --dropout_source, Marian --dropout-src; Sennrich & Zhang 2019: 0.1-0.3 "
                                   "in low-resource settings)", minimum=0.0, maximum=1.0, max_inclusive=False),
        "tgt_word_dropout": Option(float, 0.0, "the same for the target (decoder input) tokens (Nematus "
                                   "--dropout_target, Marian --dropout-trg)", minimum=0.0, maximum=1.0,
                                   max_inclusive=False),
        "pretrained": {  # null: no vectors, nothing frozen
            "src": Option(str, None, "a new run's source table starts from this text file of vectors (GloVe "
                          "'token v1 ... vD' lines; word2vec / fastText text: the same after an 'N D' header; "
                          ".gz read through gzip): each vocabulary type found gets its vector; D must be the "
                          "embedding size; with share it fills the one table; not read on resume or init_from",
                          nullable=True),
            "tgt": Option(str, None, "the same for the target table (not with share)", nullable=True),
            "freeze_src": Option(bool, False, "keep the source table (with share: the shared one) fixed during "
                                 "training (OpenNMT-py -freeze_word_vecs_enc)"),
            "freeze_tgt": Option(bool, False, "keep the target table fixed (with tie_output: the output layer's "
                                 "weight too; not with share) (OpenNMT-py -freeze_word_vecs_dec)"),
        },
    },
    "transformer": {
        "encoder_layers": Option(int, 6, "encoder layers", minimum=1, maximum=MAX_LAYERS),
        "decoder_layers": Option(int, 6, "decoder layers", minimum=1, maximum=MAX_LAYERS),
        "d_model": Option(int, 512, "model (and embedding) size", minimum=1, maximum=MAX_SIZE),
        "heads": Option(int, 8, "attention heads (d_model must be a multiple)", minimum=1, maximum=MAX_SIZE),
        "kv_heads": Option(int, 0, "key/value heads of every attention: grouped-query attention (Ainslie et al. "
                           "2023; 1: multi-query attention, Shazeer 2019), each group of heads / kv_heads query "
                           "heads shares one key/value projection, so the decoder's key/value cache and the "
                           "cross-attention's keys and values are heads / kv_heads times smaller; heads must be a "
                           "multiple (0: as many as heads; OpenNMT-py num_kv)", minimum=0, maximum=MAX_SIZE),
        "alignment_layer": Option(int, -1, "the decoder layer whose cross-attention gives word alignments "
                                  "(nmt-translate -report_align, -replace_unk) and which training.guided_alignment "
                                  "supervises: 0-based, negative from the last (-1: the last; OpenNMT-py "
                                  "-alignment_layer)", minimum=-MAX_LAYERS, maximum=MAX_LAYERS - 1),
        "alignment_heads": Option(int, 0, "how many of that layer's heads (the first ones) give alignments (their "
                                  "mean) and are supervised, each on its own (0: all; OpenNMT-py -alignment_heads)",
                                  minimum=0, maximum=MAX_SIZE),
        "full_context_alignment": Option(bool, False, "alignments (guided alignment's supervision, -report_align, "
                                         "-replace_unk, -attention, the validation AER) from a second decoder pass "
                                         "up to alignment_layer without the future mask: each target position "
                                         "sees the whole target (Garg et al. 2019; OpenNMT-py "
                                         "-full_context_alignment); the translation is unchanged"),
        "d_ff": Option(int, 2048, "inner size of the feed-forward blocks", minimum=1, maximum=MAX_SIZE),
        "norm": Option(str, "pre", "LayerNorm placement: pre (before each sub-layer, a final norm) or post",
                       choices=("pre", "post")),
        "positions": Option(str, "sinusoidal", "position encodings: sinusoidal or learned (added to the embeddings), "
                            "rotary (RoPE: self-attention queries and keys rotated by their positions; no table, "
                            "any length), relative (Shaw et al. 2018 as OpenNMT-py: learned self-attention "
                            "key/value relations of clipped offsets) or alibi (Press et al. 2022: each self-attention "
                            "head adds -m_h |i - j| to its scores; nothing learned, any length)",
                            choices=("sinusoidal", "learned", "rotary", "relative", "alibi")),
        "alibi_encoder": Option(str, "symmetric", "positions: alibi: the encoder self-attentions' bias: symmetric "
                                "(-m_h |i - j|: sees distances, not directions; a reversed source gets the reversed "
                                "encoding) or split (the heads favour the left and the right in turn, slope m_h on "
                                "their side, 2 m_h on the other: direction-aware); the decoder's is causal either way",
                                choices=("symmetric", "split")),
        "rotary_base": Option(float, 10000.0, "positions: rotary: frequency i of a head turns by position x "
                              "rotary_base^(-2i/d_head)", minimum=1, min_inclusive=False),
        "max_relative_positions": Option(int, 20, "positions: relative: offsets clipped to -K..K, 2K+1 learned "
                                         "vectors per self-attention layer", minimum=1, maximum=MAX_SIZE),
        "max_positions": Option(int, 1024, "size of the learned position tables: sources of this many tokens, BOS + this - 1 "
                                "target tokens (data.src/tgt.max_length and validation.max_length must fit)", minimum=1,
                                maximum=MAX_SIZE),
        "dropout": Option(float, 0.1, "residual dropout (on each sub-layer's output)", minimum=0.0, maximum=1.0,
                          max_inclusive=False),
        "attention_dropout": Option(float, 0.1, "dropout on attention probabilities", minimum=0.0, maximum=1.0,
                                    max_inclusive=False),
        "activation_dropout": Option(float, 0.0, "dropout on the feed-forward inner activations", minimum=0.0,
                                     maximum=1.0, max_inclusive=False),
        "activation": Option(str, "relu", "feed-forward activation: relu, gelu, silu, or gated (Shazeer 2020): "
                             "swiglu = silu(W_a x) * (W_b x), geglu = gelu(W_a x) * (W_b x), the inner product "
                             "2 x d_ff wide (keep the parameter count with d_ff two thirds of the plain one's)",
                             choices=("relu", "gelu", "silu", "swiglu", "geglu")),
        "layer_norm": Option(str, "layer", "the normalisation of every sub-layer (and the final one): layer "
                             "(LayerNorm) or rms (RMSNorm, Zhang & Sennrich 2019: x / RMS(x) * g, no centring "
                             "or bias; eps 1e-6)", choices=("layer", "rms")),
    },
    "encoder": {
        "type": Option(str, "lstm", "recurrent cell", choices=("lstm", "gru")),
        "layers": Option(int, 2, "number of layers", minimum=1, maximum=MAX_LAYERS),
        "hidden_size": Option(int, 256, "total hidden size (per direction: hidden_size // 2 when bidirectional)",
                              minimum=1, maximum=MAX_SIZE),
        "bidirectional": Option(bool, True, "bidirectional encoder"),
        "dropout": Option(float, 0.3, "dropout between layers", minimum=0.0, maximum=1.0, max_inclusive=False),
    },
    "decoder": {
        "type": Option(str, "lstm", "recurrent cell", choices=("lstm", "gru")),
        "layers": Option(int, 2, "number of layers", minimum=1, maximum=MAX_LAYERS),
        "hidden_size": Option(int, 256, "hidden size", minimum=1, maximum=MAX_SIZE),
        "dropout": Option(float, 0.3, "dropout between layers and on the attentional output",
                          minimum=0.0, maximum=1.0, max_inclusive=False),
        "input_feeding": Option(bool, True, "feed the previous attentional vector to the next step"),
        "bridge": Option(str, "linear", "encoder-to-decoder state bridge", choices=("linear", "copy", "none")),
    },
    "attention": {
        "score": Option(str, "general", "attention score function", choices=("dot", "general", "mlp")),
        "mapping": Option(str, "entmax15", "attention mapping: any nmt.sparse mapping name"),
        "params": Option(dict, {}, "parameters of the attention mapping (e.g. {alpha: 1.5} for entmax_bisect)"),
        "continuous": Option(dict, None, "null, or ContinuousAttention keyword arguments for combined attention",
                             nullable=True),
        "coverage": Option(bool, False, "RNN: each source position's key also holds its coverage, the attention "
                           "it received so far (k_j + w c_j; See et al. 2017, OpenNMT-py -coverage_attn)"),
        "encoder_self": _attention_kind("encoder self-attention"),
        "decoder_self": _attention_kind("decoder self-attention"),
        "cross": _attention_kind("cross-attention"),
    },
    "output": {
        "mapping": Option(str, "entmax15", "output mapping; the loss is its Fenchel-Young loss"),
        "params": Option(dict, {}, "parameters of the output mapping and its loss"),
        "copy": Option(bool, False, "copy source tokens: the mapping normalises the vocabulary's and the source "
                       "positions' scores jointly and a token's probability adds its copies' (OpenNMT-py -copy_attn)"),
    },
}

TRAINING = {
    "save_dir": Option(str, REQUIRED, "run directory: checkpoints, config.yaml, metrics.jsonl, tensorboard/"),
    "seed": Option(int, 1234, "seed of torch, python and numpy RNGs and of the batch order, in [0, 2^63)",
                   minimum=0, maximum=2**63 - 1),
    "device": Option(str, "auto", "cpu, cuda, cuda:N, or auto (cuda when available)"),
    "threads": Option(int, None, "torch CPU threads (null: torch default)", nullable=True, minimum=1),
    "batch_size": Option(int, 64, "sentences (or tokens, see batch_type) per batch", minimum=1),
    "batch_type": Option(str, "sentences", "unit of batch_size: sentences, or tokens = sentences x the longest "
                         "side (source, or target + EOS) in the batch, padding included",
                         choices=("sentences", "tokens")),
    "bucket_size": Option(int, None, "examples per length-sorted pool from which batches are cut (sorted as "
                          "pool_sort says; the batches are then shuffled); null: 100 batches' worth",
                          nullable=True, minimum=1),
    "pool_sort": Option(str, "target", "how a pool is sorted before it is cut into batches: target (target "
                        "length alone, the source lengths of one target length mixed at random), target_source "
                        "(target, then source length: batches of one length ratio, which trains worse; nmt's "
                        "order before this option, and what a run started before it resumes with), "
                        "source_target (OpenNMT-py's order)", choices=("target", "target_source", "source_target")),
    "max_steps": Option(int, None, "stop after this many updates (null: no step limit)", nullable=True, minimum=1),
    "max_epochs": Option(int, None, "stop after this many epochs (null: no epoch limit)", nullable=True, minimum=1),
    "max_minutes": Option(float, None, "stop after this much training time, validation included, over all "
                          "sessions of the run (null: no time limit)", nullable=True, minimum=0.0),
    "optimizer": {
        "name": Option(str, "adam", "optimizer: adam (weight_decay: L2, added to the gradient), adamw (Adam "
                       "with decoupled weight decay: the weights shrink by lr x weight_decay each update), sgd, "
                       "adafactor (factored second moments, sync-free: see the adafactor section)",
                       choices=("adam", "adamw", "sgd", "adafactor")),
        "lr": Option(float, 1e-3, "initial learning rate (adafactor with relative_step: the cap of the relative "
                     "step size 1 / sqrt(t); the paper's is 0.01)", minimum=0.0, min_inclusive=False),
        "betas": Option(list, [0.9, 0.999], "adam / adamw betas"),
        "eps": Option(float, 1e-8, "adam / adamw epsilon", minimum=0.0),
        "momentum": Option(float, 0.0, "sgd momentum", minimum=0.0, maximum=1.0, max_inclusive=False),
        "nesterov": Option(bool, False, "sgd: Nesterov momentum (needs momentum > 0)"),
        "weight_decay": Option(float, 0.0, "weight decay: L2 for adam and sgd, decoupled for adamw and adafactor",
                               minimum=0.0),
        "decay_vectors": Option(bool, True, "false: biases, norm gains and other vectors (1-D parameters) get no "
                                "weight decay, only matrices and embeddings do (two parameter groups: HF "
                                "Transformers' and nanoGPT's rule); needs weight_decay > 0"),
        "adafactor": {
            "relative_step": Option(bool, True, "step size min(lr, 1 / sqrt(t)) at update t (false: lr)"),
            "scale_parameter": Option(bool, True, "step size times max(eps2, RMS of the parameter): steps relative "
                                      "to the parameter's scale"),
            "beta1": Option(float, None, "first-moment decay (null: none, the paper's default: no n x m state)",
                            nullable=True, minimum=0.0, maximum=1.0, max_inclusive=False),
            "decay_rate": Option(float, -0.8, "second-moment decay beta2_t = 1 - t ** decay_rate", maximum=0.0,
                                 max_inclusive=False),
            "clip_threshold": Option(float, 1.0, "update clipping: the update is scaled down to RMS at most this",
                                     minimum=0.0, min_inclusive=False),
            "eps1": Option(float, 1e-30, "added to the squared gradient", minimum=0.0, min_inclusive=False),
            "eps2": Option(float, 1e-3, "floor of the parameter scale (scale_parameter)", minimum=0.0),
        },
    },
    "accumulate": Option(int, 1, "batches per update (gradient accumulation; the loss is normalised over all "
                         "of them, see normalization)", minimum=1),
    "normalization": Option(str, "tokens", "what an update's summed loss is divided by: tokens (its target "
                            "tokens, EOS included: a per-token mean) or sents (its sentences: OpenNMT-py's "
                            "default); over every accumulated batch of every process", choices=("tokens", "sents")),
    "lr_schedule": {
        "type": Option(str, "plateau", "plateau: warmup, then halving on validation-loss plateaus; noam (alias "
                       "inverse_sqrt): warmup, then inverse square root decay; constant: warmup, then lr; linear / "
                       "cosine: warmup, then linear / cosine decay to min_lr over decay_steps (default max_steps; cosine with "
                       "period_steps: restarts); "
                       "exponential: warmup, times decay_factor from start_decay_steps on, every decay_steps",
                       choices=("plateau", "noam", "inverse_sqrt", "constant", "linear", "cosine", "exponential")),
        "warmup_steps": Option(int, 0, "linear warmup from warmup_init_lr to lr over this many steps", minimum=0),
        "warmup_init_lr": Option(float, 0.0, "where the warmup's line starts (at update 0; "
                                 "fairseq's --warmup-init-lr), at most lr; needs warmup_steps", minimum=0.0),
        "decay_factor": Option(float, 0.5, "plateau: multiply lr by this when validation loss does not improve; "
                               "exponential: the factor of each decay",
                               minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False),
        "decay_patience": Option(int, 0, "validations without improvement tolerated before a decay", minimum=0),
        "min_lr": Option(float, 0.0, "never decay below this learning rate", minimum=0.0),
        "decay_steps": Option(int, None, "linear / cosine: updates from the start to the end of the decay (null: "
                              "training.max_steps); exponential: updates between decays", nullable=True, minimum=1),
        "start_decay_steps": Option(int, 0, "exponential: the update of the first decay (0: decay_steps)", minimum=0),
        "period_steps": Option(int, None, "cosine: restart the decay every cycle, the first this many updates "
                               "after the warmup long (fairseq's lr_period_updates, SGDR's T_0; null: no restarts, "
                               "one decay over decay_steps)", nullable=True, minimum=1),
        "t_mult": Option(float, 1.0, "cosine with period_steps: each cycle this many times longer than the one "
                         "before (fairseq's --t-mult, SGDR's T_mult)", minimum=1.0),
        "lr_shrink": Option(float, 1.0, "cosine with period_steps: each cycle's lr and min_lr this times the "
                            "previous one's (fairseq's --lr-shrink)", minimum=0.0, maximum=1.0, min_inclusive=False),
    },
    "clip_grad_norm": Option(float, 5.0, "clip the global gradient norm (null: no clipping)", nullable=True,
                             minimum=0.0, min_inclusive=False),
    "label_smoothing": Option(float, 0.0, "label smoothing of the loss", minimum=0.0, maximum=1.0, max_inclusive=False),
    "coverage_loss": Option(float, 0.0, "weight of the coverage loss, sum over target steps and source positions of "
                            "min(attention, the attention received before) (See et al. 2017; OpenNMT-py "
                            "-lambda_coverage); 0: off", minimum=0.0),
    "nonfinite": Option(str, "stop", "on a NaN / inf training loss: stop (one-line error naming the step; "
                        "last.pt keeps the last finite state) or skip the update (not counted as a step, "
                        "nor by the lr schedule; 100 skipped in a row stop the run)", choices=("stop", "skip")),
    "precision": Option(str, "fp32", "fp32, bf16 (autocast) or fp16 (autocast and loss scaling)",
                        choices=("fp32", "bf16", "fp16")),
    "compile": Option(bool, False, "torch.compile the forward and loss (CUDA graphs on CUDA); needs a C++ "
                      "compiler on CPU ($CXX or g++), a C one on CUDA ($CC, gcc or clang)"),
    "compile_encoder": Option(bool, False, "with compile: an LSTM encoder inside the compiled graph (its padding made inert) instead of packing between graphs: one graph per step, longer compilation"),
    "checkpoint_activations": Option(bool, False, "recompute each Transformer layer's activations in the "
                                     "backward pass instead of keeping them (fairseq's --checkpoint-activations): "
                                     "less activation memory for about one more forward pass per step; the same "
                                     "loss and gradients (model.type: transformer)"),
    "pad_to_multiple": Option(int, 1, "pad batch lengths to a multiple of this (with compile, e.g. 8: few compiled shapes)", minimum=1),
    "early_stopping_patience": Option(int, None, "stop after this many validations without improvement of "
                                      "validation.metric (null: never)", nullable=True, minimum=1),
    "valid_every": Option(int, 500, "validate (and checkpoint) every this many steps", minimum=1),
    "log_every": Option(int, 50, "log training loss and tokens/s every this many steps", minimum=1),
    "keep_last": Option(int, 3, "keep this many step checkpoints besides last.pt and best.pt", minimum=0),
    "keep_best": Option(int, 0, "keep the checkpoints of this many best validations by validation.metric "
                        "(best_step_N.pt; ties: the earlier step; nmt-average -best N averages them); 0: off",
                        minimum=0),
    "progress": Option(bool, True, "tqdm progress bar (where stderr is a terminal)"),
    "tensorboard": Option(bool, True, "write TensorBoard events to save_dir/tensorboard"),
    "resume_ignore_data_change": Option(bool, False, "resume even when a data file changed since last.pt was "
                                        "saved (a warning instead of an error; the vocabulary stays the "
                                        "checkpoint's)"),
    "init_from": Option(str, None, "fine-tune: start a new run from this checkpoint file (or run directory: its "
                        "best.pt): its weights, tokenizers and vocabularies; fresh step, optimizer, lr schedule and "
                        "early stopping; ignored once save_dir holds a checkpoint (the run resumes)", nullable=True),
    "init_optimizer": Option(bool, False, "with init_from: also carry the parent's optimizer state (Adam moments; "
                             "hyperparameters from this config)"),
    "init_vocab": Option(str, "keep", "with init_from: keep the parent's vocabularies (new tokens are <unk>), or "
                         "extend them with the new training data's tokens (OpenNMT-py's -update_vocab): the parent's "
                         "tokens keep their ids and rows, new ones get fresh rows", choices=("keep", "extend")),
    "freeze": Option(list, [], "model parts kept fixed in training, any of src_embeddings, tgt_embeddings, "
                     "encoder, decoder, generator (OpenNMT-py -freeze_encoder / -freeze_decoder; a table shared "
                     "with a frozen part is frozen with it); []: none"),
    "ema": {
        "decay": Option(float, 0.0, "exponential moving average of the weights, ema = decay * ema + (1 - decay) * "
                        "weights after each applied update; validation, best.pt and translation use it "
                        "(0: off; e.g. 0.999)", minimum=0.0, maximum=1.0, max_inclusive=False),
        "start_step": Option(int, 0, "up to this update the average is a copy of the weights", minimum=0),
        "every": Option(int, 1, "average every this many updates", minimum=1),
        "warmup": Option(bool, False, "decay min(decay, (1 + n) / (10 + n)) at the n-th averaging update "
                         "(TensorFlow's num_updates rule)"),
    },
    "distill": {
        "teacher": Option(str, None, "word-level knowledge distillation: an nmt checkpoint file (or run directory: "
                          "its best.pt) whose source and target vocabularies equal this run's; at every target "
                          "position the loss also pulls the student toward the teacher's output distribution "
                          "on the same teacher-forced prefix; null: off", nullable=True),
        "weight": Option(float, 0.5, "w: loss = (1 - w) x loss at the reference + w x loss at the teacher's "
                         "distribution (both the student's own Fenchel-Young loss; 1: the teacher alone)",
                         minimum=0.0, maximum=1.0, min_inclusive=False),
        "temperature": Option(float, 1.0, "the teacher's scores are divided by this before its own output mapping "
                              "(> 1: a flatter, for entmax teachers also denser distribution)",
                              minimum=0.0, min_inclusive=False),
    },
    "guided_alignment": {
        "weight": Option(float, 0.0, "guided alignment (OpenNMT-py -lambda_align, fairseq --alignment-lambda): the "
                         "loss adds weight x the alignment attention's own Fenchel-Young loss at the reference "
                         "alignments (data.train.align), per supervised head, normalised as the main loss; the "
                         "heads: model.transformer.alignment_layer / alignment_heads (an RNN: its one attention); "
                         "0: off", minimum=0.0),
    },
}

VALIDATION = {
    "metric": Option(str, "loss", "metric that selects best.pt and drives early stopping", choices=METRICS),
    "batch_size": Option(int, 64, "validation batch size in sentences", minimum=1),
    "decode": Option(bool, True, "decode the validation set (exact-match accuracy, BLEU, chrF, TER)"),
    "metrics": Option(list, list(DECODING_METRICS), "the decoding metrics computed at each validation, any of "
                      "exact_match, bleu, chrf, ter (OpenNMT-py -valid_metrics); validation.metric, when one of them, "
                      "must be listed"),
    "beam_size": Option(int, 1, "beam size when decoding (1: greedy)", minimum=1),
    "max_length": Option(int, 100, "maximum hypothesis length when decoding", minimum=1),
    "max_length_ratio": Option(float, 0.0, "when > 0, each validation sentence also stops at floor(ratio x its "
                               "source tokens) + max_length_offset tokens (nmt-translate -max_length_ratio)",
                               minimum=0.0),
    "max_length_offset": Option(int, 5, "tokens added to the max_length_ratio limit", minimum=0),
    "block_ngram_repeat": Option(int, 0, "N >= 1: no validation hypothesis holds an N-gram twice "
                                 "(nmt-translate -block_ngram_repeat); 0 = off", minimum=0),
    # the search options below are SearchOptions fields of the same name and default (nmt-translate's
    # flags); their values are checked by SearchOptions itself (nmt.train.validation.validation_search)
    "min_length": Option(int, 0, "at least this many tokens before EOS (nmt-translate -min_length)"),
    "length_penalty": Option(str, "none", "ranking of finished hypotheses: none | average | gnmt (with "
                             "length_alpha; nmt-translate -length_penalty)"),
    "length_alpha": Option(float, 0.6, "gnmt length penalty's alpha (nmt-translate -length_alpha)"),
    "coverage_penalty": Option(str, "none", "none | wu | summary: finished hypotheses rank by score / lp + "
                               "beta x the penalty of their attention's coverage (nmt-translate "
                               "-coverage_penalty)"),
    "beta": Option(float, 0.0, "weight of the coverage penalty, >= 0 (nmt-translate -beta)"),
    "coverage_epsilon": Option(float, 1e-6, "wu's floor of a source token's coverage, in (0, 1] (sparse "
                               "attention; nmt-translate -coverage_epsilon)"),
    "stepwise_penalty": Option(bool, False, "the beam also keeps, at every step, the prefixes of best "
                               "penalized score (nmt-translate -stepwise_penalty)"),
    "ban_unk_token": Option(bool, False, "<unk> gets probability 0 at every step (nmt-translate "
                            "-ban_unk_token)"),
    "mbr": Option(str, "none", "none | chrf | bleu | exact_match: each validation sentence's output is the minimum "
                  "Bayes risk decision among the beam's finished hypotheses, as nmt-translate -mbr chooses (needs "
                  "beam_size >= 2)"),
    "n_heatmaps": Option(int, 3, "attention heatmaps of the first n validation sentences in TensorBoard",
                         minimum=0),
}

SCHEMA = {"data": DATA, "model": MODEL, "training": TRAINING, "validation": VALIDATION}

RESUME_DEFAULTS = {"training.pool_sort": "target_source"}
"""Options whose schema default (what a new run gets) is not what nmt did before the option
existed: dotted key -> that earlier behaviour's value, which a run resumed from a checkpoint
lacking the key keeps unless its config sets another value (see ``nmt.config.resume_defaults``)."""

__all__ = ["SCHEMA", "METRICS", "DECODING_METRICS", "HIGHER_IS_BETTER", "RESUME_DEFAULTS"]
