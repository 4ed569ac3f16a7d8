"""Where a path lives and what the page cache holds of it.

Mount point, filesystem type and device (with a warning for network and layered
filesystems), free space, RAM, page-cache residency (mmap + mincore), eviction
(posix_fadvise DONTNEED) and whether O_DIRECT really bypasses the cache here.
Linux only; elsewhere the functions degrade to "unknown" rather than fail.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
from dataclasses import asdict, dataclass

import numpy as np
import psutil

from gpuprof.units import GiB, UNKNOWN

# Filesystems whose speed is set by a network, a server or a user-space daemon, and layered
# ones that add a copy-up/lookup layer. Reads there vary from run to run.
NETWORK_FS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ceph", "lustre", "gpfs",
    "beegfs", "glusterfs", "wekafs", "afs", "ncpfs", "orangefs", "pvfs2", "panfs", "gfs2",
    "ocfs2", "davfs", "sshfs", "s3fs", "juicefs", "cvfs", "vboxsf", "vmhgfs",
}
LAYERED_FS = {"overlay", "overlayfs", "aufs", "unionfs", "mergerfs"}
MEMORY_FS = {"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"}


@dataclass
class FsInfo:
    """The filesystem a path is on. `kind` is local, network, fuse, layered or memory."""

    mountpoint: str
    type: str
    device: str
    kind: str
    free_bytes: int
    total_bytes: int
    warning: str | None
    read_ahead_kb: int | None = None
    # the block device's kernel driver and model (sysfs), and whether they name a virtual disk
    # (VIRTUAL_DRIVERS, VIRTUAL_MODELS): a host below it may cache what the VM just wrote
    block_driver: str | None = None
    block_model: str | None = None
    virtual_disk: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def classify_fs(fstype: str) -> str:
    """'nfs4' -> 'network', 'fuse.sshfs' -> 'fuse', 'overlay' -> 'layered', 'ext4' -> 'local'."""
    t = fstype.lower()
    if t in NETWORK_FS or t.split(".")[-1] in NETWORK_FS:
        return "network"
    if t in ("fuse", "fuseblk") or t.startswith("fuse."):
        return "fuse"
    if t in LAYERED_FS:
        return "layered"
    if t in MEMORY_FS:
        return "memory"
    return "local"


def fs_warning(fstype: str, kind: str) -> str | None:
    """One sentence for filesystems where the numbers need care, else None."""
    if kind == "network":
        return (f"{fstype} is a network filesystem: its speed depends on the network and the "
                "server and changes from run to run; a local copy of the dataset is safer")
    if kind == "fuse":
        return (f"{fstype} is a FUSE (user-space) filesystem, often remote or object storage: "
                "every read crosses a daemon; a local copy of the dataset is safer")
    if kind == "layered":
        return (f"{fstype} is a layered filesystem (container image layer): reads go through "
                "the overlay; put datasets on a volume mounted from local disk")
    if kind == "memory":
        return (f"{fstype} keeps files in RAM: the 'cold' numbers are memory speed, not a "
                "disk's, and the data disappears at reboot")
    return None


def filesystem_info(path: str) -> FsInfo:
    """Mount point, type and device of the filesystem holding `path` (which must exist)."""
    real = os.path.realpath(path)
    best = None
    # all=True: psutil hides "nodev" filesystems (nfs, 9p, overlay, tmpfs...) by default.
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if real == mp or real.startswith(mp.rstrip("/") + "/"):
            # The longest mount point wins; for equal ones the later mount shadows the earlier.
            if best is None or len(mp) >= len(best.mountpoint):
                best = part
    usage = shutil.disk_usage(real if os.path.isdir(real) else os.path.dirname(real) or ".")
    if best is None:
        mountpoint, fstype, device = UNKNOWN, "unknown", UNKNOWN
    else:
        mountpoint, fstype, device = best.mountpoint, best.fstype, best.device
    kind = classify_fs(fstype)
    driver, model = block_device_identity(device)
    return FsInfo(mountpoint=mountpoint, type=fstype, device=device, kind=kind,
                  free_bytes=usage.free, total_bytes=usage.total,
                  warning=fs_warning(fstype, kind), read_ahead_kb=read_ahead_kb(device),
                  block_driver=driver, block_model=model, virtual_disk=is_virtual_disk(driver, model))


# Kernel drivers of paravirtual block devices: the disk is a file or volume on a host, whose own
# page cache (or a volume service's) may answer reads of recently written blocks.
VIRTUAL_DRIVERS = frozenset({"virtio_blk", "xen_blkfront", "vbd"})
# Models cloud and hypervisor disks report (NVMe or SCSI emulation of a network volume or image).
VIRTUAL_MODELS = ("Amazon Elastic Block Store", "PersistentDisk", "Virtual Disk", "QEMU HARDDISK",
                  "VBOX HARDDISK", "VMware Virtual")


def is_virtual_disk(driver: str | None, model: str | None) -> bool:
    return driver in VIRTUAL_DRIVERS or any(m.lower() in (model or "").lower() for m in VIRTUAL_MODELS)


def block_device_identity(device: str, sys_root: str = "/sys/class/block") -> tuple[str | None, str | None]:
    """(kernel driver, model) of the block device behind `device` (/dev/vda1 -> vda's): sysfs's
    device/driver link and device/model file, a partition read through its disk; None where
    sysfs does not say (not a block device, a container without /sys)."""
    if not device.startswith("/dev/"):
        return None, None
    try:
        name = os.path.basename(os.path.realpath(device))
        sys_dir = os.path.realpath(os.path.join(sys_root, name))
        for d in (sys_dir, os.path.dirname(sys_dir)):
            dev = os.path.join(d, "device")
            if not os.path.isdir(dev):
                continue
            link = os.path.join(dev, "driver")
            driver = os.path.basename(os.path.realpath(link)) if os.path.exists(link) else None
            model = None
            for f in (os.path.join(dev, "model"), os.path.join(os.path.dirname(os.path.realpath(dev)), "model")):
                if os.path.isfile(f):
                    with open(f, errors="replace") as fh:
                        model = fh.read().strip() or None
                    break
            return driver, model
    except (OSError, ValueError):
        pass
    return None, None


def read_ahead_kb(device: str) -> int | None:
    """The block device's readahead window (/sys/.../queue/read_ahead_kb), if it has one.

    An mmap page fault reads around the faulting page by this much, so it sets how many
    bytes one cold np.memmap sample costs. Partitions use their disk's queue.
    """
    if not device.startswith("/dev/"):
        return None
    try:
        name = os.path.basename(os.path.realpath(device))
        sys_dir = os.path.realpath(os.path.join("/sys/class/block", name))
        for d in (sys_dir, os.path.dirname(sys_dir)):
            f = os.path.join(d, "queue", "read_ahead_kb")
            if os.path.exists(f):
                with open(f) as fh:
                    return int(fh.read().strip())
    except (OSError, ValueError):
        pass
    return None


def ram_bytes() -> tuple[int, int]:
    """(total, available) RAM in bytes."""
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


# ---------------------------------------------------------------- page-cache residency

_libc = None


def _load_libc():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.restype = ctypes.c_int
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = lib
    return _libc


def mincore_is_truthful(path: str) -> bool:
    """Whether the kernel tells us the truth about this file's cached pages.

    Since Linux 5.2 mincore() reports every page as resident for a file the caller neither
    owns nor could open for writing (a side-channel fix). Root (CAP_FOWNER) is always told.
    """
    st = os.stat(path)
    euid = os.geteuid()
    if euid == 0 or st.st_uid == euid:
        return True
    return os.access(path, os.W_OK, effective_ids=True)


def resident_pages(fd: int, size: int, offset: int = 0) -> np.ndarray:
    """mincore() vector for [offset, offset+size) of an open file: 1 per cached page.

    Maps the file PROT_READ in 1 GiB windows (no page is touched, so nothing is read).
    """
    page = mmap.PAGESIZE
    libc = _load_libc()
    start = offset - offset % page
    end = offset + size
    out = np.zeros((end - start + page - 1) // page, dtype=np.uint8)
    window = GiB
    pos = start
    while pos < end:
        length = min(window, end - pos)
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, pos)
        if addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap for mincore: {os.strerror(err)}")
        try:
            npages = (length + page - 1) // page
            vec = np.zeros(npages, dtype=np.uint8)
            if libc.mincore(addr, length, vec.ctypes.data) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore: {os.strerror(err)}")
            first = (pos - start) // page
            out[first:first + npages] = vec & 1
        finally:
            libc.munmap(addr, length)
        pos += length
    return out


@dataclass
class Residency:
    """How much of a file the page cache holds now. known=False: the kernel won't say."""

    size_bytes: int
    resident_bytes: int | None
    known: bool
    reason: str | None = None

    @property
    def fraction(self) -> float | None:
        if not self.known or self.resident_bytes is None:
            return None
        return self.resident_bytes / self.size_bytes if self.size_bytes else 0.0


def residency(path: str, offset: int = 0, length: int | None = None) -> Residency:
    """Bytes of `path` (or of one region of it) in the page cache right now."""
    size = os.stat(path).st_size
    length = size - offset if length is None else min(length, size - offset)
    if length <= 0:
        return Residency(0, 0, True)
    if not mincore_is_truthful(path):
        return Residency(length, None, False,
                         "not your file and not writable: the kernel reports every page as "
                         "cached (mincore), so residency is unknown")
    fd = os.open(path, os.O_RDONLY)
    try:
        vec = resident_pages(fd, length, offset)
    except OSError as exc:
        return Residency(length, None, False, f"mincore failed: {exc.strerror}")
    finally:
        os.close(fd)
    page = mmap.PAGESIZE
    resident = int(vec.sum()) * page
    return Residency(length, min(resident, length), True)


def evict(fd: int, offset: int = 0, length: int = 0) -> None:
    """Drop a file's clean pages from the page cache (length 0 = to the end).

    Pages still mapped by a live mmap and dirty pages stay; write + fsync before calling.
    """
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


# ---------------------------------------------------------------- cache bypass

@dataclass
class CacheBypass:
    """How cold reads avoid the page cache here.

    method: "O_DIRECT" (reads bypass the cache), "fadvise" (buffered reads, the file is
    evicted with posix_fadvise DONTNEED before each cold run) or "none" (nothing works, e.g.
    tmpfs: cold numbers are cache numbers). alignment: O_DIRECT offset/length granularity.
    """

    method: str
    alignment: int
    note: str


def aligned_buffer(size: int) -> mmap.mmap:
    """A page-aligned, writable buffer (anonymous mmap), as O_DIRECT needs."""
    page = mmap.PAGESIZE
    return mmap.mmap(-1, max(page, (size + page - 1) // page * page))


def _direct_alignment(path: str) -> tuple[int | None, str]:
    """Smallest O_DIRECT read granularity that works (512 or 4096), or None and why."""
    if not hasattr(os, "O_DIRECT"):
        return None, "O_DIRECT is not available on this OS"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        return None, f"O_DIRECT refused by the filesystem ({exc.strerror})"
    try:
        buf = aligned_buffer(8192)
        for align in (512, 4096):
            try:
                n = os.preadv(fd, [memoryview(buf)[:align]], align)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    continue
                return None, f"O_DIRECT read failed ({exc.strerror})"
            if n == align:
                return align, "ok"
        return None, "O_DIRECT reads fail at 512 and 4096-byte alignment"
    finally:
        os.close(fd)


def choose_cache_bypass(path: str, fs: FsInfo) -> CacheBypass:
    """Find out how this filesystem lets us read `path` cold, and check that it works.

    O_DIRECT is tried first and verified with mincore where the kernel tells the truth: some
    filesystems accept O_DIRECT and quietly read through the cache anyway.
    """
    if fs.kind == "memory":
        return CacheBypass("none", 1, f"{fs.type} is memory: there is no cache to bypass")
    size = os.stat(path).st_size
    truthful = mincore_is_truthful(path)
    align, why = _direct_alignment(path)
    probe_off, probe_len = size // 2 // 65536 * 65536, 65536
    if align is not None:
        if not truthful:
            return CacheBypass("O_DIRECT", align, "O_DIRECT (not verified: residency unknown)")
        fd = os.open(path, os.O_RDONLY)
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            evict(fd)
            buf = aligned_buffer(probe_len)
            os.preadv(dfd, [buf], probe_off)
            cached = int(resident_pages(fd, probe_len, probe_off).sum())
        finally:
            os.close(dfd)
            os.close(fd)
        if cached == 0:
            return CacheBypass("O_DIRECT", align, f"O_DIRECT, {align}-byte aligned")
        why = "O_DIRECT reads went through the page cache anyway"
    fd = os.open(path, os.O_RDONLY)
    try:
        evict(fd)
        if not truthful:
            return CacheBypass("fadvise", 1, f"{why}; posix_fadvise DONTNEED eviction "
                                             "(not verified: residency unknown)")
        os.pread(fd, probe_len, probe_off)
        evict(fd)
        left = int(resident_pages(fd, probe_len, probe_off).sum())
    finally:
        os.close(fd)
    if left == 0:
        return CacheBypass("fadvise", 1, f"{why}; evicting with posix_fadvise DONTNEED")
    return CacheBypass("none", 1, f"{why}; and posix_fadvise DONTNEED does not evict here: "
                                  "cold numbers include the page cache")
