#!/usr/bin/env python3
"""Prepare German-English translation data for nmt: Multi30k (task 1) and IWSLT 2017 de-en.

Multi30k: raw, untokenized ``train``/``val``/``test_2016_flickr`` ``.de``/``.en`` files. With
``--data-dir`` they are copied from a local copy; otherwise they are downloaded from the Multi30k repository
(github.com/multi30k/dataset, ``data/task1/raw``). Subword segmentation (joint sentencepiece or
BPE) is learned by ``nmt-train`` from the training files, as the recipe's configs say, and
stored inside every checkpoint.

IWSLT 2017 de-en (TED talks): downloaded on a user's machine from the IWSLT 2017 release
(``2017-01-trnted/texts/de/en/de-en.tgz``, mirrored by the Hugging Face ``IWSLT/iwslt2017``
dataset); the XML/tag files are converted to plain ``train``/``valid`` (dev2010) /``test``
(tst2010-2015 concatenated) text.

Usage:
  python recipes/translation/prepare.py multi30k [--data-dir A_LOCAL_COPY] [--out data/multi30k]
  python recipes/translation/prepare.py iwslt17 [--archive de-en.tgz] [--out data/iwslt17]
"""
from __future__ import annotations

import argparse
import gzip
import io
import os
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{name}.gz"
MULTI30K_FILES = [f"{split}.{lang}" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]
IWSLT17_URL = ("https://huggingface.co/datasets/IWSLT/iwslt2017/resolve/main/data/2017-01-trnted/"
               "texts/de/en/de-en.zip")
SEG = re.compile(r"<seg id=\"?\d+\"?>\s*(.*?)\s*</seg>")


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def prepare_multi30k(out: Path, data_dir: Path | None) -> None:
    """Copy (or download) the six Multi30k files into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in MULTI30K_FILES:
        if data_dir is not None:
            source = data_dir / name
            if not source.exists():
                raise FileNotFoundError(f"{source}: missing Multi30k file")
            _write_atomic(out / name, source.read_bytes())
        else:
            with urllib.request.urlopen(MULTI30K_URL.format(name=name), timeout=60) as response:
                _write_atomic(out / name, gzip.decompress(response.read()))
        print(f"  {out / name}")


def _plain_train(text: str) -> list[str]:
    """Training files interleave XML-ish metadata lines (starting with '<') with sentences."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("<")]


def _plain_xml(text: str) -> list[str]:
    return SEG.findall(text)


def prepare_iwslt17(out: Path, archive: Path | None) -> None:
    """Extract IWSLT 2017 de-en into ``train``/``valid``/``test`` ``.de``/``.en`` plain text."""
    import zipfile

    if archive is None:
        with urllib.request.urlopen(IWSLT17_URL, timeout=300) as response:
            payload = response.read()
    else:
        payload = archive.read_bytes()
    members: dict[str, bytes] = {}
    outer = zipfile.ZipFile(io.BytesIO(payload)) if payload[:2] == b"PK" else None
    blobs = [outer.read(n) for n in outer.namelist() if n.endswith((".tgz", ".tar.gz"))] if outer else [payload]
    for blob in blobs:
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    members[Path(member.name).name] = tar.extractfile(member).read()
    out.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        train = _plain_train(members[f"train.tags.de-en.{lang}"].decode("utf-8"))
        valid = _plain_xml(members[f"IWSLT17.TED.dev2010.de-en.{lang}.xml"].decode("utf-8"))
        test = []
        for year in range(2010, 2016):
            name = f"IWSLT17.TED.tst{year}.de-en.{lang}.xml"
            if name in members:
                test += _plain_xml(members[name].decode("utf-8"))
        for split, lines in (("train", train), ("valid", valid), ("test", test)):
            _write_atomic(out / f"{split}.{lang}", "".join(line + "\n" for line in lines).encode("utf-8"))
            print(f"  {out / f'{split}.{lang}'}: {len(lines)} lines")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", choices=("multi30k", "iwslt17"))
    parser.add_argument("--data-dir", type=Path, default=None, help="multi30k: a local copy to use instead of downloading")
    parser.add_argument("--archive", type=Path, default=None, help="iwslt17: a downloaded de-en archive")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default data/CORPUS)")
    args = parser.parse_args(argv)
    out = args.out or Path("data") / args.corpus
    try:
        if args.corpus == "multi30k":
            prepare_multi30k(out, args.data_dir)
        else:
            prepare_iwslt17(out, args.archive)
    except (OSError, KeyError, tarfile.TarError) as e:
        print(f"prepare: error: {e}", file=sys.stderr)
        return 1
    print(f"prepared {args.corpus} into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
