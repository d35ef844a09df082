"""The quick-start task: a synthetic verb-inflection language, generated from a seed.

Source line: the tags then the lemma's characters, space-separated (``V PST 3 SG t a l a m``);
target line: the inflected word (``talomda``), to be char-tokenized.

The language
------------
Letters: vowels ``a e i o u`` (front: ``e i``; back: ``a o u``); consonants, voiceless
``p t k s`` and voiced ``b d g m n l r v z``.

Lemmas: 2 or 3 syllables consonant+vowel; the last one is closed by a coda consonant
(``p t k s m n l r``) half of the time, e.g. ``mapo``, ``kiset``, ``talam``.

Cells (12 per lemma): tense ``PRS | PST`` x person ``1 | 2 | 3`` x number ``SG | PL``; the
source starts with ``V``, so the tag symbols are V, PRS, PST, 1, 2, 3, SG, PL.

Rules, applied in order (H is the harmony vowel: ``e`` if the lemma's last vowel is front,
``a`` if it is back):

1. Stem change (ablaut): in the PST, a lemma that ends in a consonant and whose last vowel is
   ``a`` changes that ``a`` to ``o`` (``talam`` -> ``talom-``).
2. Past tense: the PST adds ``dH`` after a vowel or a voiced consonant and ``tH`` after a
   voiceless one (``mapo`` -> ``mapoda``, ``kiset`` -> ``kisette``).
3. Agreement suffix: 1SG ``m``, 2SG ``s``, 3SG nothing, 1PL ``mHz``, 2PL ``sHz``, 3PL ``lHr``.
4. Epenthesis: when the word so far ends in a consonant and the agreement suffix is not empty,
   H is inserted before it (``talam`` + 1SG -> ``talamam``; ``kiset`` + 3PL -> ``kiseteler``).

Ambiguity: after a lemma ending in ``r`` the past marker is ``dH`` or ``tH`` in free variation,
chosen at random (probability 1/2) for each (lemma, tag) cell; these are about 3% of the cells
(1/2 closed x 1/8 ``r`` x 1/2 PST), so the best achievable exact-match accuracy is about 98.4%.
Every other cell has exactly one correct form.

Splits: lemmas are drawn without repetition (about one lemma per 4 examples); the (lemma,
tag) cells of train and valid are disjoint samples of all cells, so valid lemmas mostly also
occur in train with other tags (as in SIGMORPHON shared tasks).

Run as ``python -m nmt.data.synthetic OUT_DIR [--seed S] [--n-train N] [--n-valid N] [--overwrite]``.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from nmt.data.errors import DataError
from nmt.data.textfiles import PathLike, write_lines_atomic

VOWELS = "aeiou"
FRONT_VOWELS = "ei"
VOICELESS = "ptks"
ONSETS = "ptkbdgmnlrsvz"
CODAS = "ptksmnlr"
FREE_VARIATION_CODA = "r"
TENSES = ("PRS", "PST")
PERSONS = ("1", "2", "3")
NUMBERS = ("SG", "PL")
CELLS = tuple((t, p, n) for t in TENSES for p in PERSONS for n in NUMBERS)
AGREEMENT = {
    ("1", "SG"): "m",
    ("2", "SG"): "s",
    ("3", "SG"): "",
    ("1", "PL"): "mHz",
    ("2", "PL"): "sHz",
    ("3", "PL"): "lHr",
}
FILES = ("train.src", "train.tgt", "valid.src", "valid.tgt")


def harmony_vowel(lemma: str) -> str:
    """``e`` if the last vowel of ``lemma`` is front (e, i), else ``a``."""
    last = [c for c in lemma if c in VOWELS][-1]
    return "e" if last in FRONT_VOWELS else "a"


def inflect(lemma: str, tense: str, person: str, number: str) -> tuple[str, ...]:
    """All correct forms of a cell: one, or two (``d``/``t`` past) after a final ``r``."""
    h = harmony_vowel(lemma)
    stem = lemma
    if tense == "PST" and lemma[-1] not in VOWELS:
        k = max(i for i, c in enumerate(lemma) if c in VOWELS)
        if lemma[k] == "a":
            stem = lemma[:k] + "o" + lemma[k + 1 :]
    if tense == "PST":
        if lemma[-1] == FREE_VARIATION_CODA:
            markers = ("d", "t")
        else:
            markers = ("t",) if lemma[-1] in VOICELESS else ("d",)
        bases = [stem + m + h for m in markers]
    else:
        bases = [stem]
    agr = AGREEMENT[(person, number)].replace("H", h)
    return tuple(b + (h if agr and b[-1] not in VOWELS else "") + agr for b in bases)


def random_lemma(rng: random.Random) -> str:
    """A pseudo-lemma: 2-3 CV syllables, the last closed by a coda with probability 1/2."""
    n = 2 if rng.random() < 0.6 else 3
    word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(n))
    if rng.random() < 0.5:
        word += rng.choice(CODAS)
    return word


def source_line(lemma: str, tense: str, person: str, number: str) -> str:
    """``V PST 3 SG t a l a m``."""
    return " ".join(["V", tense, person, number, *lemma])


def generate_examples(seed: int = 1234, n_train: int = 6000, n_valid: int = 500) -> dict[str, list[str]]:
    """The four files' lines (``train.src`` ...), deterministic for ``seed``; nothing written."""
    if n_train < 1 or n_valid < 0:
        raise DataError(f"quickstart: need n_train >= 1 and n_valid >= 0, got {n_train}, {n_valid}")
    rng = random.Random(seed)
    n_lemmas = max(1, -(-(n_train + n_valid) // 4))
    lemmas: list[str] = []
    seen: set[str] = set()
    attempts = 0
    while len(lemmas) < n_lemmas:
        attempts += 1
        if attempts > 50 * n_lemmas + 1000:
            raise DataError(f"quickstart: cannot draw {n_lemmas} distinct lemmas")
        w = random_lemma(rng)
        if w not in seen:
            seen.add(w)
            lemmas.append(w)
    cells = [(lemma, *cell) for lemma in lemmas for cell in CELLS]
    chosen = rng.sample(cells, n_train + n_valid)
    out: dict[str, list[str]] = {name: [] for name in FILES}
    for k, (lemma, tense, person, number) in enumerate(chosen):
        split = "train" if k < n_train else "valid"
        out[f"{split}.src"].append(source_line(lemma, tense, person, number))
        out[f"{split}.tgt"].append(rng.choice(inflect(lemma, tense, person, number)))
    return out


def generate_quickstart(
    out_dir: PathLike,
    seed: int = 1234,
    n_train: int = 6000,
    n_valid: int = 500,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Write ``train.src/train.tgt/valid.src/valid.tgt`` into ``out_dir``; return their paths.

    Existing files are never overwritten unless ``overwrite``: when all four exist they are kept
    as they are; when only some exist a ``DataError`` names them. Each file is written atomically.
    """
    out_dir = Path(out_dir)
    paths = {name: out_dir / name for name in FILES}
    existing = [p for p in paths.values() if p.exists()]
    if existing and not overwrite:
        if len(existing) == len(paths):
            return paths
        raise DataError(
            f"{existing[0]}: exists but {', '.join(str(p) for p in paths.values() if not p.exists())} "
            f"do not; remove it or pass overwrite=True (--overwrite)"
        )
    for name, lines in generate_examples(seed, n_train, n_valid).items():
        write_lines_atomic(paths[name], lines)
    return paths


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m nmt.data.synthetic OUT_DIR [--seed S] [--n-train N] [--n-valid N] [--overwrite]``."""
    parser = argparse.ArgumentParser(
        prog="python -m nmt.data.synthetic", description="Write the quick-start inflection task."
    )
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--n-train", type=int, default=6000)
    parser.add_argument("--n-valid", type=int, default=500)
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    try:
        paths = generate_quickstart(args.out_dir, args.seed, args.n_train, args.n_valid, args.overwrite)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(" ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
