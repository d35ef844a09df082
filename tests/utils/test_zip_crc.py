"""Checkpoint integrity: torch.load does not check the CRC-32s of a torch.save archive (pinned
here); nmt's loader does, naming the file and the record, for every nmt command that loads."""
from __future__ import annotations

import struct
import zipfile

import pytest
import torch

from nmt.utils.checkpoint_file import DamagedCheckpointError, load_checkpoint, save_checkpoint
from nmt.utils.zip_crc import zip_crc_problem


def record_data_offset(path, name_suffix: str) -> tuple[str, int, int]:
    """(record name, offset of its data in the file, its size) of the record whose name ends so,
    found by Python's zipfile (an independent reader of the archive)."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(name_suffix))
    with open(path, "rb") as handle:
        handle.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
    return info.filename, info.header_offset + 30 + name_length + extra_length, info.file_size


def flip_bit(path, offset: int, bit: int = 4) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def payload(n: int = 50_000) -> dict:
    return {"model": {"w": torch.arange(n, dtype=torch.float32), "b": torch.ones(7)}, "optimizer": {},
            "scheduler": {}, "step": 3, "epoch": 0, "rng": {}, "config": {}, "src_field": {}, "tgt_field": {},
            "metrics": {}, "trainer": {}}


def test_torch_load_does_not_detect_a_flipped_bit_in_tensor_data(tmp_path):
    """Why nmt checks: with this torch a flipped bit inside a tensor loads silently (if a later
    torch raises here, load_checkpoint's check is merely redundant)."""
    path = tmp_path / "a.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, path)
    _, start, size = record_data_offset(path, "/data/0")
    flip_bit(path, start + size // 2)
    loaded = torch.load(path, weights_only=True)["w"]
    assert not torch.equal(loaded, torch.arange(1000, dtype=torch.float32))
    assert int((loaded != torch.arange(1000, dtype=torch.float32)).sum()) == 1


@pytest.mark.parametrize("suffix", ["/data/0", "/data/1", "/data.pkl", "/byteorder"])
def test_a_flipped_bit_in_any_record_is_found_as_zipfile_finds_it(tmp_path, suffix):
    """The record named is the one Python's zipfile.testzip (its own CRC-32 reader) names."""
    path = tmp_path / "c.pt"
    save_checkpoint(path, payload())
    assert zip_crc_problem(path) is None and zipfile.ZipFile(path).testzip() is None
    name, start, size = record_data_offset(path, suffix)
    flip_bit(path, start + size - 1, bit=0)
    assert zipfile.ZipFile(path).testzip() == name
    problem = zip_crc_problem(path)
    assert problem is not None and problem.startswith(f"record {name!r} fails its CRC-32 check")
    with pytest.raises(DamagedCheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: damaged: record {name!r} fails its CRC-32 check")
    assert "\n" not in str(info.value)


def test_archives_written_without_crc32_are_not_checked(tmp_path):
    """torch.serialization.set_crc32_options(False) stores 0 for every record: nothing to verify;
    save_checkpoint writes CRC-32s whatever that option says (and leaves it as it was)."""
    path = tmp_path / "n.pt"
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(payload(), path)
        save_checkpoint(tmp_path / "c.pt", payload())
        assert torch.serialization.get_crc32_options() is False
    finally:
        torch.serialization.set_crc32_options(True)
    assert {i.CRC for i in zipfile.ZipFile(path).infolist()} == {0}
    assert zip_crc_problem(path) is None
    assert 0 not in {i.CRC for i in zipfile.ZipFile(tmp_path / "c.pt").infolist() if i.file_size}
    assert zip_crc_problem(tmp_path / "c.pt") is None


def test_a_broken_record_header_or_a_cut_is_a_problem(tmp_path):
    path = tmp_path / "h.pt"
    save_checkpoint(path, payload())
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    flip_bit(path, info.header_offset, bit=0)  # the local header's signature
    assert zip_crc_problem(path) == f"the header of record {info.filename!r} is broken"


def test_nmt_translate_average_and_release_refuse_a_flipped_checkpoint(tmp_path, capsys):
    """All three load through load_checkpoint: one line naming the file, exit 2."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from tiny_task import tiny_config, write_task

    from nmt.cli import average as average_cli
    from nmt.cli import release as release_cli
    from nmt.cli import translate as translate_cli
    from nmt.config import resolve_config
    from nmt.train.trainer import Trainer

    data = write_task(tmp_path / "data")
    Trainer(resolve_config(tiny_config(data, tmp_path / "run", max_steps=4), "tiny.yaml"), "tiny.yaml").train()
    model = tmp_path / "run" / "last.pt"
    _, start, size = record_data_offset(model, "/data/0")
    flip_bit(model, start + size // 2)
    commands = [
        (translate_cli, ["-model", str(model), "-src", data["valid"]["src"], "-output", str(tmp_path / "out.txt")]),
        (average_cli, ["-models", str(model), str(model), "-output", str(tmp_path / "avg.pt")]),
        (release_cli, ["-model", str(model), "-output", str(tmp_path / "rel.pt")]),
    ]
    for cli, args in commands:
        assert cli.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"{model}: damaged: record " in err and "fails its CRC-32 check" in err, err
