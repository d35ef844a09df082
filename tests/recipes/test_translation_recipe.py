"""The translation recipe's data preparation (Multi30k copy, IWSLT 2017 extraction)."""
import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "multi30k"
spec = importlib.util.spec_from_file_location("prepare_translation", ROOT / "recipes" / "translation" / "prepare.py")
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)


def _tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"de-en/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_iwslt17_extraction_from_release_layout(tmp_path):
    files = {}
    for lang, words in (("de", ["Hallo Welt", "Danke"]), ("en", ["Hello world", "Thanks"])):
        files[f"train.tags.de-en.{lang}"] = f"<url>http://x</url>\n<talkid>1</talkid>\n{words[0]}\n{words[1]}\n"
        files[f"IWSLT17.TED.dev2010.de-en.{lang}.xml"] = f'<doc>\n<seg id="1"> {words[0]} </seg>\n</doc>\n'
        files[f"IWSLT17.TED.tst2010.de-en.{lang}.xml"] = f'<seg id="1">{words[1]}</seg>\n'
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("de-en/de-en.tgz", _tar(files))
    archive = tmp_path / "de-en.zip"
    archive.write_bytes(buf.getvalue())
    prepare.prepare_iwslt17(tmp_path / "out", archive)
    assert (tmp_path / "out" / "train.de").read_text(encoding="utf-8") == "Hallo Welt\nDanke\n"
    assert (tmp_path / "out" / "valid.en").read_text(encoding="utf-8") == "Hello world\n"
    assert (tmp_path / "out" / "test.en").read_text(encoding="utf-8") == "Thanks\n"


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared Multi30k data not present")
def test_multi30k_copy(tmp_path):
    prepare.prepare_multi30k(tmp_path, SHARED)
    assert len((tmp_path / "val.de").read_text(encoding="utf-8").splitlines()) == 1014
    assert prepare.main(["multi30k", "--data-dir", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 1
