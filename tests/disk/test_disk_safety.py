"""Nothing lost: other files untouched, dataset files never opened for writing, the test
file removed on success, on error and on Ctrl-C, and O_EXCL never clobbers a file."""

import builtins
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from gpuprof.disk import bench, fs, suite, target
from gpuprof.units import MiB
from gpuprof.errors import GpuprofError

TINY = dict(size_bytes=2 * MiB, duration_s=0.01, repeats=2, readers=2, block_size=64,
            batch_size=2, seed=0)


def _snapshot(d):
    out = {}
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        st = os.stat(p)
        with open(p, "rb") as f:
            out[name] = (hashlib.sha256(f.read()).hexdigest(), st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def populated(tmp_path):
    for name, size in (("train.bin", 3 * MiB), ("val.bin", 100_000), ("notes.txt", 12)):
        (tmp_path / name).write_bytes(os.urandom(size))
    return tmp_path


def test_directory_run_leaves_other_files_and_no_test_file(populated):
    before = _snapshot(populated)
    r = suite.run_bench(str(populated), suite.BenchConfig(**TINY))
    assert r["mode"] == "directory" and r["measured_file_bytes"] == 2 * MiB
    assert _snapshot(populated) == before  # same names, checksums, sizes, mtimes


def test_dataset_file_is_never_opened_for_writing(populated, monkeypatch):
    data = str(populated / "train.bin")
    before = _snapshot(populated)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    opened = []
    real_os_open, real_open = os.open, builtins.open

    def spy_os_open(path, flags, *a, **k):
        opened.append((str(path), flags))
        return real_os_open(path, flags, *a, **k)

    def spy_open(file, mode="r", *a, **k):
        if isinstance(file, (str, os.PathLike)):
            opened.append((str(file), mode))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(os, "open", spy_os_open)
    monkeypatch.setattr(builtins, "open", spy_open)
    r = suite.run_bench(data, suite.BenchConfig(**TINY))
    monkeypatch.undo()
    assert r["mode"] == "file" and r["file"]["size_bytes"] == 3 * MiB
    mine = [(p, f) for p, f in opened if os.path.abspath(p) == os.path.abspath(data)]
    assert mine, "the dataset file was not read at all?"
    for _, f in mine:
        if isinstance(f, int):
            assert f & write_flags == 0
        else:
            assert not set(f) & set("wax+")
    assert _snapshot(populated) == before


@pytest.mark.parametrize("exc", [RuntimeError("injected fault"), KeyboardInterrupt()])
def test_no_leftover_after_fault_mid_run(populated, monkeypatch, exc):
    before = _snapshot(populated)
    real = bench.read_random
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # the test file exists and has been read once
            assert any(n.startswith(target.TEST_FILE_PREFIX) for n in os.listdir(populated))
            raise exc
        return real(*a, **k)

    monkeypatch.setattr(bench, "read_random", flaky)
    with pytest.raises(type(exc)):
        suite.run_bench(str(populated), suite.BenchConfig(**TINY))
    assert _snapshot(populated) == before


def test_no_leftover_when_filling_fails(populated, monkeypatch):
    before = _snapshot(populated)

    def full_disk(fd, size, seed):
        os.write(fd, b"x" * 1000)
        raise GpuprofError("writing the test file failed (No space left on device)")

    monkeypatch.setattr(target, "_fill", full_disk)
    with pytest.raises(GpuprofError, match="No space"):
        suite.run_bench(str(populated), suite.BenchConfig(**TINY))
    assert _snapshot(populated) == before


def test_refused_when_free_space_under_twice_size(populated, monkeypatch):
    before = _snapshot(populated)
    real = fs.filesystem_info

    def nearly_full(path):
        info = real(path)
        info.free_bytes = 3 * MiB  # < 2 x 2 MiB
        return info

    monkeypatch.setattr(fs, "filesystem_info", nearly_full)
    with pytest.raises(GpuprofError, match="needs twice that"):
        suite.run_bench(str(populated), suite.BenchConfig(**TINY))
    assert _snapshot(populated) == before


def test_o_excl_never_clobbers_an_existing_file(populated, monkeypatch):
    monkeypatch.setattr(target.secrets, "token_hex", lambda n: "fixed")
    name = f"{target.TEST_FILE_PREFIX}{os.getpid()}-fixed.tmp"
    (populated / name).write_bytes(b"precious")
    before = _snapshot(populated)
    with pytest.raises(GpuprofError, match="cannot create a test file"):
        suite.run_bench(str(populated), suite.BenchConfig(**TINY))
    assert _snapshot(populated) == before


def test_removal_spares_a_file_that_replaced_ours(tmp_path):
    p = tmp_path / "ours"
    p.write_bytes(b"a")
    st = os.stat(p)
    (tmp_path / "theirs").write_bytes(b"someone else's")  # allocated while ours exists
    os.replace(tmp_path / "theirs", p)  # same name, another inode
    target._remove_if_ours(str(p), (st.st_dev, st.st_ino))
    assert p.read_bytes() == b"someone else's"


def test_file_too_small_for_pattern(tmp_path):
    small = tmp_path / "tiny.bin"
    small.write_bytes(b"\0" * 4096)
    with pytest.raises(GpuprofError, match="too small"):
        suite.run_bench(str(small), suite.BenchConfig(**TINY))


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 130)])
def test_real_signal_mid_run_removes_test_file(populated, sig, code):
    before = _snapshot(populated)
    proc = subprocess.Popen([sys.executable, "-m", "gpuprof", "bench-disk", str(populated),
                             "--size", "8Mi", "--duration", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    try:
        # wait until the test file exists and measuring has begun
        while not any(n.startswith(target.TEST_FILE_PREFIX) for n in os.listdir(populated)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == "gpuprof: interrupted"
    assert _snapshot(populated) == before


def test_a_fresh_test_file_on_a_virtual_disk_is_said_to_be_an_upper_bound(populated, monkeypatch):
    """On a virtual disk the host below may cache what bench-disk just wrote: a directory run says
    its figures are an upper bound and points at the dataset file; a dataset file's run does not
    (that file was written before), and a physical disk's run does not."""
    import dataclasses

    real = fs.filesystem_info

    def virtual(path):
        return dataclasses.replace(real(path), block_driver="virtio_blk", virtual_disk=True)

    monkeypatch.setattr(fs, "filesystem_info", virtual)
    r = suite.run_bench(str(populated), suite.BenchConfig(**TINY))
    said = [w for w in r["warnings"] if "just written to a virtual disk (virtio_blk)" in w]
    assert len(said) == 1 and "bench-disk DATASET_FILE" in said[0]
    assert r["filesystem"]["virtual_disk"] is True and r["filesystem"]["block_driver"] == "virtio_blk"
    r = suite.run_bench(str(populated / "train.bin"), suite.BenchConfig(**TINY))
    assert not any("just written" in w for w in r["warnings"])
    monkeypatch.setattr(fs, "filesystem_info", lambda p: dataclasses.replace(real(p), virtual_disk=False))
    r = suite.run_bench(str(populated), suite.BenchConfig(**TINY))
    assert not any("just written" in w for w in r["warnings"])
