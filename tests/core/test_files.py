"""The shared file helpers: atomic writes, one-line read errors, outputs that never replace a
file gpuprof did not write (the script, a dataset, a file the run opened, someone else's file
through a link), checked before a run and again after it, and rescued to a fallback file."""

import errno
import json
import os
from pathlib import Path

import pytest

from gpuprof import files
from gpuprof.errors import GpuprofError
from gpuprof.files import (Output, atomic_write, check_outputs, check_writable, gpuprof_kind,
                           read_user_text, save_or_rescue)

PROFILE = json.dumps({"schema_version": 1, "tool": {"name": "gpuprof", "version": "0"}}, indent=2)
TRACE = '{"traceEvents":[\n{"name":"process_name","ph":"M","ts":0,"pid":0,"tid":0,"args":{"name":"gpuprof: x"}}\n]}\n'
HTML = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="generator" '
        'content="gpuprof"><title>gpuprof report</title></head><body></body></html>\n')


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


# -- which existing files may be replaced ----------------------------------------------------


def test_each_kind_is_recognised_from_its_first_bytes_and_nothing_else_is(tmp_path):
    for kind, text in {"profile": PROFILE, "trace": TRACE, "html": HTML}.items():
        (tmp_path / kind).write_text(text)
        assert gpuprof_kind(tmp_path / kind) == kind
    for other in ("import torch\n", '{"schema_version": 1}', "<!DOCTYPE html><html><head><title>x</title>",
                  "# a config\nbatch_size = 1\n"):
        (tmp_path / "x").write_text(other)
        assert gpuprof_kind(tmp_path / "x") is None
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 64)
    assert gpuprof_kind(tmp_path / "b.bin") is None and gpuprof_kind(tmp_path / "missing") is None


def test_an_existing_file_is_replaced_only_when_it_is_gpuprofs_own_of_that_kind_or_forced(tmp_path):
    script, profile = tmp_path / "train.py", tmp_path / "run.json"
    script.write_text("import torch\n")
    profile.write_text(PROFILE)
    assert check_writable(profile, kind="profile") == profile
    for kind in ("html", "trace"):  # a profile is neither a report nor a trace
        with pytest.raises(GpuprofError, match="is not a gpuprof"):
            check_writable(profile, kind=kind, option="--html")
    with pytest.raises(GpuprofError) as exc:
        check_writable(script, kind="html", option="--html")
    assert str(exc.value) == (f"--html: {script} already exists and is not a gpuprof HTML report; gpuprof "
                              f"replaces only its own files of that kind (choose another path, or pass --force)")
    assert check_writable(script, kind="html", force=True) == script
    assert script.read_text() == "import torch\n"  # a check never writes


def test_protected_files_are_never_replaced_not_even_with_force(tmp_path):
    data = tmp_path / "train.bin"
    data.write_bytes(b"\0" * 64)
    protected = {files.same_file_key(data): "a file this run opened"}
    with pytest.raises(GpuprofError, match="is a file this run opened; gpuprof never replaces it"):
        check_writable(tmp_path / "." / "train.bin", kind="profile", force=True, protected=protected)


def test_a_link_is_written_through_to_the_users_own_file_of_that_kind_only(tmp_path):
    mine, report = tmp_path / "notes.txt", tmp_path / "run-3.html"
    mine.write_text("hello")
    report.write_text(HTML)
    (tmp_path / "link.html").symlink_to(mine)
    (tmp_path / "latest.html").symlink_to(report)
    (tmp_path / "dangling.html").symlink_to(tmp_path / "gone.html")
    with pytest.raises(GpuprofError, match="is not a gpuprof HTML report"):
        check_writable(tmp_path / "link.html", kind="html")
    with pytest.raises(GpuprofError, match="symbolic link to .*gone.html, which does not exist"):
        check_writable(tmp_path / "dangling.html", kind="html")
    assert check_writable(tmp_path / "latest.html", kind="html") == report
    s = save_or_rescue(tmp_path / "latest.html", HTML + "<!-- new -->", kind="html")
    assert not s.rescued and s.path == report and report.read_text().endswith("<!-- new -->")
    assert (tmp_path / "latest.html").is_symlink()  # the link still points at the new report
    assert mine.read_text() == "hello"


def test_a_link_into_another_users_file_is_refused(tmp_path, monkeypatch):
    report = tmp_path / "theirs.html"
    report.write_text(HTML)
    (tmp_path / "link.html").symlink_to(report)
    monkeypatch.setattr(files.os, "geteuid", lambda: os.stat(report).st_uid + 1)
    with pytest.raises(GpuprofError, match="another user's file; gpuprof never writes through it"):
        check_writable(tmp_path / "link.html", kind="html", force=True)


# -- before the run ----------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
def test_proc_refuses_new_files_and_says_so():
    with pytest.raises(GpuprofError) as exc:
        check_writable("/proc/x.json", option="--out")
    assert str(exc.value) == ("--out: cannot write /proc/x.json: cannot create files in /proc "
                              "(FileNotFoundError: No such file or directory)")


def test_unwritable_shapes_of_path(tmp_path):
    (tmp_path / "a.txt").write_text("mine")
    cases = {
        tmp_path / "missing" / "x.json": f"folder {tmp_path / 'missing'} does not exist",
        tmp_path: "it is a directory",
        tmp_path / "a.txt" / "x.json": f"{tmp_path / 'a.txt'} is not a folder",
    }
    for path, text in cases.items():
        with pytest.raises(GpuprofError, match="^--out: ") as exc:
            check_writable(path, kind="profile", option="--out")
        assert text in str(exc.value)
    with pytest.raises(GpuprofError, match="already exists; pass --force"):
        check_writable(tmp_path / "a.txt", option="--write")
    assert check_writable(tmp_path / "a.txt", force=True) == tmp_path / "a.txt"
    # The probe file it creates to prove the folder takes files is gone again.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    assert (tmp_path / "a.txt").read_text() == "mine"


def test_a_device_is_never_replaced():
    with pytest.raises(GpuprofError, match="not a regular file"):
        check_writable(os.devnull, kind="profile", force=True, option="--out")


def test_outputs_may_not_collide_or_replace_an_input(tmp_path):
    data = tmp_path / "train.bin"
    data.write_bytes(b"\0" * 64)
    a = Output("--out", tmp_path / "p.json", "profile", "the profile")
    with pytest.raises(GpuprofError, match="--out and --write both name"):
        check_outputs([a, Output("--write", tmp_path / "." / "p.json", "config", "the config")])
    with pytest.raises(GpuprofError, match=r"--out: .*train.bin is this run's --data; writing the profile"):
        check_outputs([Output("--out", data, "profile", "the profile")], force=True, inputs=[("--data", data)])
    check_outputs([a], inputs=[("--data", data), ("script", None)])
    assert data.read_bytes() == b"\0" * 64


# -- after the run -----------------------------------------------------------------------------


def test_a_file_that_appeared_or_changed_during_the_run_is_kept(tmp_path):
    out, html = tmp_path / "run.json", tmp_path / "r.html"
    html.write_text(HTML)
    plan = check_outputs([Output("--out", out, "profile", "the profile"),
                          Output("--html", html, "html", "the HTML report")])
    out.write_text(PROFILE)  # the script wrote a gpuprof-looking file there meanwhile
    html.write_text(HTML + "changed")
    for option in ("--out", "--html"):
        s = plan.save(option, "new", folders=[tmp_path])
        assert s.rescued and "written during the run" in s.error and s.path.read_text() == "new"
    assert out.read_text() == PROFILE and html.read_text() == HTML + "changed"


def test_a_file_the_run_opened_is_kept(tmp_path):
    ckpt = tmp_path / "ckpt.json"
    ckpt.write_text(PROFILE)  # even one that looks like gpuprof's
    plan = check_outputs([Output("--out", ckpt, "profile", "the profile")])
    s = plan.save("--out", "new", opened={files.same_file_key(ckpt): "a file this run opened"},
                  folders=[tmp_path])
    assert s.rescued and "is a file this run opened" in s.error and ckpt.read_text() == PROFILE


def test_an_unchanged_gpuprof_file_is_replaced_after_the_run(tmp_path):
    out = tmp_path / "run.json"
    out.write_text(PROFILE)
    plan = check_outputs([Output("--out", out, "profile", "the profile")])
    s = plan.save("--out", PROFILE + "\n")
    assert not s.rescued and out.read_text() == PROFILE + "\n"


def test_a_failed_write_goes_to_the_first_folder_that_takes_it(tmp_path):
    rescue = tmp_path / "rescue"
    rescue.mkdir()
    first = save_or_rescue(tmp_path / "gone" / "run.gpuprof.json", "{}",
                           folders=[tmp_path / "also-gone", rescue])
    second = save_or_rescue(tmp_path / "gone" / "run.gpuprof.json", "[]", folders=[rescue])
    assert first.rescued and "does not exist" in first.error
    assert first.path.parent == rescue and first.path.name.startswith("run.gpuprof.rescued-")
    assert first.path.suffix == ".json" and first.path.read_text() == "{}"
    assert second.path != first.path and second.path.read_text() == "[]"  # nothing clobbered


def test_an_existing_config_is_kept_without_force_even_one_gpuprof_wrote(tmp_path):
    mine = tmp_path / "corrected.py"
    mine.write_text("# gpuprof corrected config: apply on top of your own, e.g.\nbatch_size = 12\n")
    s = save_or_rescue(mine, "batch_size = 64\n", folders=[tmp_path])
    assert s.rescued and "already exists; pass --force" in s.error
    assert mine.read_text().endswith("batch_size = 12\n") and s.path.read_text() == "batch_size = 64\n"


def test_when_no_folder_takes_it_the_result_says_so(tmp_path, monkeypatch):
    def full(path, data, overwrite=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "atomic_write", full)
    s = save_or_rescue(tmp_path / "p.json", "{}", folders=[tmp_path])
    assert s.path is None and s.error.count("No space left on device") == 2


def test_written_where_asked_is_not_rescued(tmp_path):
    s = save_or_rescue(tmp_path / "p.json", "{}")
    assert not s.rescued and s.path == tmp_path / "p.json" and s.path.read_text() == "{}"
