"""Behaviour as a user who does not own the files: mincore lies, directories are read-only.

As root these tests fork a child that drops to uid/gid 65534 (nobody) and reports back
through a pipe; as an ordinary user they run in-process.
"""

import json
import os
import shutil
import tempfile

import pytest
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.disk import fs


def _as_nobody(fn):
    """Run fn() in a child with uid/gid 65534; return its JSON-able result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = fn()
        except BaseException as exc:  # report, never return into pytest
            out, code = {"error": repr(exc)}, 1
        os.write(w, json.dumps(out).encode())
        os.close(w)
        os._exit(code)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


@pytest.fixture
def shared_dir():
    """A directory other users can enter (pytest's tmp_path is 0700)."""
    d = tempfile.mkdtemp(prefix="gpuprof-disk-test-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a file nobody owns")
def test_residency_unknown_for_files_user_neither_owns_nor_can_write(shared_dir):
    path = os.path.join(shared_dir, "train.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(256 * 1024))
    os.chmod(path, 0o644)  # readable, not writable, owned by root
    fd = os.open(path, os.O_RDONLY)
    fs.evict(fd)
    os.close(fd)

    def probe():
        r = fs.residency(path)
        # What the kernel reports to this user: everything "resident", which is the lie.
        fd = os.open(path, os.O_RDONLY)
        raw = int(fs.resident_pages(fd, 256 * 1024).sum())
        os.close(fd)
        return {"known": r.known, "resident": r.resident_bytes, "raw_pages": raw}

    out = _as_nobody(probe)
    assert out.get("error") is None, out
    assert out["known"] is False and out["resident"] is None
    if fs.filesystem_info(path).kind != "memory":
        assert out["raw_pages"] == 64  # the lie: all 64 pages "resident" after eviction
    assert fs.residency(path).known is True  # root is told the truth


def _readonly_dir_result(d):
    result = CliRunner().invoke(app, ["bench-disk", d, "--size", "2Mi", "--duration", "0.01"])
    return {"code": result.exit_code, "stderr": result.stderr, "stdout": result.stdout}


def test_read_only_directory_is_refused_in_one_line(shared_dir):
    ro = os.path.join(shared_dir, "ro")
    os.mkdir(ro)
    before = set(os.listdir(ro))
    os.chmod(ro, 0o555)
    try:
        if os.geteuid() == 0:  # root writes anywhere: try as nobody
            # Load click's lazily imported modules now: nobody may not read site-packages.
            CliRunner().invoke(app, ["bench-disk", "--help"])
            CliRunner().invoke(app, ["bench-disk", os.path.join(ro, "missing")])
            out = _as_nobody(lambda: _readonly_dir_result(ro))
        else:
            out = _readonly_dir_result(ro)
    finally:
        os.chmod(ro, 0o755)
    assert out.get("error") is None, out
    assert out["code"] == 2
    lines = out["stderr"].strip().splitlines()
    assert len(lines) == 1 and "not writable" in lines[0], out
    assert set(os.listdir(ro)) == before
