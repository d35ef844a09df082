#!/usr/bin/env python3
"""Prepare CoNLL-SIGMORPHON 2018 task 1 for nmt in the multilingual setting of Peters et al. (2019).

Input files (one per language and setting) have lines ``lemma<TAB>form<TAB>tags`` (tags
``;``-separated); covered test files have ``lemma<TAB>tags``. All languages of one setting
(high, medium or low) are pooled into one corpus; dev and test likewise. Each source line is

    <language> TAG1 TAG2 ... l e m m a

(space-tokenized; a space inside a lemma becomes the token ``▁``), each target line is the
inflected form itself (to be char-tokenized). ``SPLIT.lang`` records the language of every
line, so evaluation can report per-language figures. The test split reads the gold test file
``LANG-test`` (``lemma<TAB>form<TAB>tags``, released after the shared task) where it exists and
the covered one otherwise; ``test.tgt`` is written when every language has its gold file.

Get the data from the shared task repository (https://github.com/sigmorphon/conll2018,
``task1/all`` and ``task1/surprise``) and pass its directory with ``--data-dir``.

Usage: python recipes/morphology/prepare.py --data-dir DIR --setting medium --out data/morphology/medium
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SPACE_TOKEN = "▁"
SETTINGS = ("high", "medium", "low")


def source_line(language: str, lemma: str, tags: str) -> str:
    """The model's source: language token, tags, lemma characters (space-separated)."""
    chars = [SPACE_TOKEN if c == " " else c for c in lemma]
    return " ".join([f"<{language}>", *tags.split(";"), *chars])


def read_split(path: Path, covered: bool) -> list[tuple[str, str, str]]:
    """Read ``(lemma, form, tags)`` triples (form is "" for covered files); one-line errors."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if covered and len(parts) == 2:
                rows.append((parts[0], "", parts[1]))
            elif len(parts) == 3:
                lemma, form, tags = parts
                rows.append((lemma, form, tags))
            else:
                raise ValueError(f"{path}:{n}: expected {'2 or 3' if covered else 3} tab-separated fields, got {len(parts)}")
    return rows


def languages_for(data_dir: Path, setting: str) -> list[str]:
    """Languages that have a training file for ``setting``."""
    suffix = f"-train-{setting}"
    return sorted(p.name[: -len(suffix)] for p in data_dir.iterdir() if p.name.endswith(suffix))


def write_atomic(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def prepare(data_dir: Path, setting: str, out: Path, languages: list[str] | None = None,
            valid_per_language: int = 50) -> dict[str, int]:
    """Write ``{train,dev,test}.{src,tgt,lang}`` under ``out``; returns line counts per split.

    Also writes ``valid.{src,tgt,lang}``: the first ``valid_per_language`` dev lines of every
    language, a small, balanced set for validation during training (the full dev set is for
    the final evaluation).
    """
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: SIGMORPHON 2018 data directory not found (see --help)")
    langs = languages or languages_for(data_dir, setting)
    if not langs:
        raise FileNotFoundError(f"{data_dir}: no *-train-{setting} files")
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, pattern, covered in (("train", f"{{}}-train-{setting}", False), ("dev", "{}-dev", False),
                                    ("test", "{}-covered-test", True)):
        src, tgt, lang = [], [], []
        all_gold = True  # the test split has targets only if every language has its gold file
        gold_found = 0
        for language in langs:
            path = data_dir / pattern.format(language)
            gold = data_dir / f"{language}-test" if split == "test" else None
            if gold is not None and gold.exists():  # released gold test: lemma, form, tags
                rows = read_split(gold, covered=False)
                gold_found += 1
            elif path.exists():
                rows = read_split(path, covered)
                all_gold = all_gold and not covered
            elif split == "train":
                raise FileNotFoundError(f"{path}: missing training file for language {language!r}")
            else:
                continue
            for lemma, form, tags in rows:
                src.append(source_line(language, lemma, tags))
                tgt.append(form)
                lang.append(language)
        write_atomic(out / f"{split}.src", src)
        if all_gold:
            write_atomic(out / f"{split}.tgt", tgt)
        elif split == "test":
            (out / "test.tgt").unlink(missing_ok=True)  # never keep targets of another run
            if gold_found:  # a partial test.tgt would not line up with test.src
                print(f"prepare: test.tgt not written: gold test files (LANG-test) for {gold_found} of "
                      f"{len(langs)} languages", file=sys.stderr)
        write_atomic(out / f"{split}.lang", lang)
        counts[split] = len(src)
        if split == "dev":
            seen: dict[str, int] = {}
            keep = []
            for i, language in enumerate(lang):
                seen[language] = seen.get(language, 0) + 1
                if seen[language] <= valid_per_language:
                    keep.append(i)
            for suffix, lines in (("src", src), ("tgt", tgt), ("lang", lang)):
                write_atomic(out / f"valid.{suffix}", [lines[i] for i in keep])
            counts["valid"] = len(keep)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="directory with LANG-train-SETTING, LANG-dev, LANG-covered-test (or gold LANG-test) "
                        "files (the shared task's task1/all)")
    parser.add_argument("--setting", choices=SETTINGS, default="medium")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default data/morphology/SETTING)")
    parser.add_argument("--languages", nargs="*", default=None, help="restrict to these languages")
    parser.add_argument("--valid-per-language", type=int, default=50,
                        help="dev lines per language in valid.* (validation during training; default 50)")
    args = parser.parse_args(argv)
    out = args.out or Path("data/morphology") / args.setting
    try:
        counts = prepare(args.data_dir, args.setting, out, args.languages, args.valid_per_language)
    except (FileNotFoundError, ValueError, UnicodeDecodeError) as e:
        print(f"prepare: error: {e}", file=sys.stderr)
        return 1
    print(f"prepared {args.setting} into {out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
