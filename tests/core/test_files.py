"""The shared file helpers: atomic writes that never clobber, one-line read errors."""

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.files import atomic_write, read_user_text


def test_atomic_write_text_and_bytes_leave_no_temp_files(tmp_path):
    atomic_write(tmp_path / "a.txt", "hello")
    atomic_write(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "a.txt").read_text() == "hello" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_no_overwrite_keeps_the_users_file(tmp_path):
    mine = tmp_path / "config.py"
    mine.write_text("batch_size = 12\n")
    with pytest.raises(GpuprofError, match="already exists"):
        atomic_write(mine, "batch_size = 64\n", overwrite=False)
    assert mine.read_text() == "batch_size = 12\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.py"]
    atomic_write(mine, "batch_size = 64\n", overwrite=True)
    assert mine.read_text() == "batch_size = 64\n"


def test_read_errors_are_one_line(tmp_path):
    with pytest.raises(GpuprofError, match="no such file"):
        read_user_text(tmp_path / "nope")
    with pytest.raises(GpuprofError, match="cannot read"):
        read_user_text(tmp_path)
    with pytest.raises(GpuprofError, match="folder .* does not exist"):
        atomic_write(tmp_path / "missing" / "x.json", "{}")
