"""Filesystem facts, page-cache residency read back after reads and eviction, cache bypass."""

import os
from collections import namedtuple

import pytest

from gpuprof.disk import fs
from gpuprof.disk.units import parse_bytes, size_label
from gpuprof.units import KiB, MiB
from gpuprof.errors import GpuprofError


def _write(path, size):
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    return str(path)


def _evictable(path):
    """Eviction only means something where a page cache sits in front of a device."""
    return fs.filesystem_info(path).kind != "memory"


@pytest.mark.parametrize("fstype,kind", [
    ("ext4", "local"), ("xfs", "local"), ("nfs4", "network"), ("nfs", "network"),
    ("cifs", "network"), ("smb3", "network"), ("9p", "network"), ("virtiofs", "network"),
    ("ceph", "network"), ("lustre", "network"), ("gpfs", "network"), ("beegfs", "network"),
    ("glusterfs", "network"), ("fuse.glusterfs", "network"), ("wekafs", "network"),
    ("fuse.sshfs", "network"), ("fuse.gcsfuse", "fuse"), ("fuse", "fuse"),
    ("fuseblk", "fuse"), ("overlay", "layered"), ("tmpfs", "memory"),
])
def test_classify_fs(fstype, kind):
    assert fs.classify_fs(fstype) == kind
    assert (fs.fs_warning(fstype, kind) is None) == (kind == "local")


def test_filesystem_info_asks_for_nodev_mounts_and_picks_longest(monkeypatch, tmp_path):
    Part = namedtuple("Part", "device mountpoint fstype opts")
    real = os.path.realpath(tmp_path)
    calls = []

    def fake_partitions(all=False):
        calls.append(all)
        parts = [Part("/dev/sda1", "/", "ext4", "rw")]
        # psutil only lists "nodev" filesystems like nfs with all=True
        if all:
            parts.append(Part("server:/export", real, "nfs4", "rw"))
        return parts

    monkeypatch.setattr(fs.psutil, "disk_partitions", fake_partitions)
    info = fs.filesystem_info(str(tmp_path))
    assert calls == [True]
    assert (info.type, info.mountpoint, info.device, info.kind) == \
        ("nfs4", real, "server:/export", "network")
    assert "network filesystem" in info.warning


def test_filesystem_info_real_path(tmp_path):
    info = fs.filesystem_info(str(tmp_path))
    assert os.path.realpath(tmp_path).startswith(info.mountpoint.rstrip("/") + "/")
    assert info.type and info.type != "unknown"
    assert 0 < info.free_bytes <= info.total_bytes


def test_residency_after_read_and_eviction(tmp_path):
    path = _write(tmp_path / "data.bin", 4 * MiB)
    if not _evictable(path):
        pytest.skip("tmp is a memory filesystem: nothing to evict")
    fd = os.open(path, os.O_RDONLY)
    try:
        fs.evict(fd)
        assert fs.residency(path).resident_bytes == 0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: read = cached
        os.pread(fd, 1 * MiB, 0)
        r = fs.residency(path)
        assert r.known and r.resident_bytes == 1 * MiB and r.fraction == pytest.approx(0.25)
        # region query: the first MiB is cached, the second is not
        assert fs.residency(path, 0, MiB).fraction == 1.0
        assert fs.residency(path, MiB, MiB).fraction == 0.0
        for off in range(0, 4 * MiB, MiB):
            os.pread(fd, MiB, off)
        assert fs.residency(path).resident_bytes == 4 * MiB
        fs.evict(fd)
        assert fs.residency(path).resident_bytes == 0
    finally:
        os.close(fd)


def test_residency_unknown_when_kernel_would_lie(tmp_path, monkeypatch):
    path = _write(tmp_path / "data.bin", 64 * KiB)
    monkeypatch.setattr(fs, "mincore_is_truthful", lambda p: False)
    r = fs.residency(path)
    assert r.known is False and r.resident_bytes is None and r.fraction is None
    assert "unknown" in r.reason


def test_residency_empty_file(tmp_path):
    path = _write(tmp_path / "empty.bin", 0)
    assert fs.residency(path).resident_bytes == 0


def test_cache_bypass_on_disk_file(tmp_path):
    path = _write(tmp_path / "data.bin", 1 * MiB)
    info = fs.filesystem_info(path)
    b = fs.choose_cache_bypass(path, info)
    if info.kind == "memory":
        assert b.method == "none"
    else:
        assert b.method in ("O_DIRECT", "fadvise")
        if b.method == "O_DIRECT":
            assert b.alignment in (512, 4096)


def test_cache_bypass_memory_fs_says_none(tmp_path):
    path = _write(tmp_path / "data.bin", 64 * KiB)
    info = fs.FsInfo("/dev/shm", "tmpfs", "tmpfs", "memory", 1, 1, "w")
    assert fs.choose_cache_bypass(path, info).method == "none"


def test_cache_bypass_falls_back_to_fadvise(tmp_path, monkeypatch):
    path = _write(tmp_path / "data.bin", 1 * MiB)
    info = fs.filesystem_info(path)
    if info.kind == "memory":
        pytest.skip("tmp is a memory filesystem")
    monkeypatch.setattr(fs, "_direct_alignment", lambda p: (None, "O_DIRECT refused"))
    b = fs.choose_cache_bypass(path, info)
    assert b.method == "fadvise" and "O_DIRECT refused" in b.note


def test_units():
    # gpuprof's one grammar (units.parse_quantity): K/M/G decimal, Ki/Mi/Gi binary, B/iB the unit
    assert parse_bytes("256Mi") == parse_bytes("256MiB") == parse_bytes("256 MiB") == 256 * MiB
    assert parse_bytes("256M") == parse_bytes("256MB") == 256_000_000
    assert parse_bytes("1GiB") == 1024 * MiB
    assert parse_bytes("4096") == parse_bytes("4096B") == 4096
    assert parse_bytes("2k") == 2000 and parse_bytes("2Ki") == parse_bytes("2KiB") == 2048
    assert parse_bytes("1.5Ki") == 1536 and parse_bytes("1e6") == 10**6 and parse_bytes("2^20") == MiB
    assert parse_bytes("1TiB") == 2**40 and parse_bytes("1T") == 10**12
    assert parse_bytes(4096) == 4096
    for bad in ("lots", "1iB", "-5", "1.0001K"):
        with pytest.raises(GpuprofError):
            parse_bytes(bad)
    assert [size_label(n) for n in (2048, 4096, 2050, MiB, 512)] == \
        ["2KiB", "4KiB", "2050B", "1MiB", "512B"]


def _sysfs(root, disk: str, driver: str | None = None, model: str | None = None, part: str | None = None):
    """A /sys/class/block-shaped tree: class/block/<name> links to devices/.../block/<disk>[/<part>],
    the disk's device/ holding a driver link and a model file."""
    dev = root / "devices" / "pci0" / "virtio1"
    blk = dev / "block" / disk
    (blk / "queue").mkdir(parents=True)
    (blk / "device").symlink_to(dev)
    if driver:
        (root / "drivers" / driver).mkdir(parents=True)
        (dev / "driver").symlink_to(root / "drivers" / driver)
    if model:
        (dev / "model").write_text(model + "\n")
    cls = root / "class" / "block"
    cls.mkdir(parents=True)
    (cls / disk).symlink_to(blk)
    if part:
        (blk / part).mkdir()
        (cls / part).symlink_to(blk / part)
    return cls


def test_a_virtio_disk_and_a_cloud_volume_are_named_virtual(tmp_path):
    cls = _sysfs(tmp_path / "a", "vda", driver="virtio_blk", part="vda1")
    assert fs.block_device_identity("/dev/vda1", str(cls)) == ("virtio_blk", None)  # a partition: its disk's
    assert fs.is_virtual_disk("virtio_blk", None)
    cls = _sysfs(tmp_path / "b", "nvme0n1", driver="nvme", model="Amazon Elastic Block Store")
    driver, model = fs.block_device_identity("/dev/nvme0n1", str(cls))
    assert (driver, model) == ("nvme", "Amazon Elastic Block Store") and fs.is_virtual_disk(driver, model)
    cls = _sysfs(tmp_path / "c", "sda", driver="sd", model="Samsung SSD 870")
    assert not fs.is_virtual_disk(*fs.block_device_identity("/dev/sda", str(cls)))
    assert fs.block_device_identity("tmpfs", str(cls)) == (None, None)  # not a block device
    assert fs.block_device_identity("/dev/nope", str(cls)) == (None, None)


def test_a_model_file_with_odd_bytes_never_raises(tmp_path):
    cls = _sysfs(tmp_path, "sdb", driver="sd")
    (tmp_path / "devices" / "pci0" / "virtio1" / "model").write_bytes(b"\xff\xfeDisk\x80")
    driver, model = fs.block_device_identity("/dev/sdb", str(cls))
    assert driver == "sd" and "Disk" in model
