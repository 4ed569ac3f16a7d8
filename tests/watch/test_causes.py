"""Likely causes from the windows before and after a change (pure), and the per-window host
counters they rest on (a child process started between two reads is counted)."""

import subprocess
import sys

from gpuprof.watch.causes import likely_causes
from gpuprof.watch.counters import FirstOpens, WindowCounters


def _w(host=None, nvml=None, files=()):
    return {"host": host or {}, "nvml": nvml or {}, "files_opened": [dict(f) for f in files]}


def test_no_cause_when_nothing_moved():
    same = _w({"read_bytes_s": 1e6, "others_cpu_cores": 0.2, "rss_bytes": 1e9, "children_started": 0})
    assert likely_causes([same, same], [same, same]) == []


def test_each_cause_with_its_figures():
    before = [_w({"read_bytes_s": 1e6, "read_chars_s": 5e6, "others_cpu_cores": 0.1, "rss_bytes": 1.0e9,
                  "children": 4, "cpu_count": 2},
                 {"sm_clock_mhz": 1980.0, "temp_c": 70.0, "throttle_share": {"gpu_idle": 0.3}},
                 files=[{"path": "/data/shard0.bin", "fstype": "ext4"}])] * 2
    after = [_w({"read_bytes_s": 9e6, "read_chars_s": 9e6, "others_cpu_cores": 0.9, "rss_bytes": 1.2e9,
                 "children": 4, "children_started": 4, "cpu_count": 2},
                {"sm_clock_mhz": 1600.0, "temp_c": 88.0, "throttle_share": {"gpu_idle": 0.3, "hw_thermal_slowdown": 0.6}},
                files=[{"path": "/mnt/nfs/shard1.bin", "fstype": "nfs4"}])] * 2
    causes = {c["kind"]: c["evidence"] for c in likely_causes(before, after)}
    assert set(causes) == {"storage", "throttle", "workers", "contention", "memory"}
    assert causes["storage"]["new_files"] == [{"path": "/mnt/nfs/shard1.bin", "fstype": "nfs4"}]
    assert causes["storage"]["filesystems_before"] == ["ext4"] and causes["storage"]["read_bytes_s_after"] == 9e6
    assert causes["throttle"]["reasons"] == {"hw_thermal_slowdown": 0.6}  # gpu_idle is a symptom, not a cause
    assert (causes["throttle"]["sm_clock_mhz_before"], causes["throttle"]["sm_clock_mhz_after"]) == (1980.0, 1600.0)
    assert causes["workers"]["children_started"] == 4
    assert round(causes["contention"]["others_cpu_cores_after"] - causes["contention"]["others_cpu_cores_before"], 6) == 0.8
    assert causes["memory"] == {"what": "rss_bytes", "before": 1.0e9, "after": 1.2e9}
    from gpuprof.report.watch import causes_line

    words = causes_line({"causes": likely_causes(before, after)})
    assert "/mnt/nfs/shard1.bin (nfs4)" in words and "another filesystem (nfs4; before: ext4)" in words
    assert "hw_thermal_slowdown in 60% of the GPU samples" in words and "SM clock 1980 → 1600 MHz" in words


def test_window_counters_see_a_child_process_start(tmp_path):
    c = WindowCounters()
    c.start()
    first = c.read()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        second = c.read()
    finally:
        child.kill()
        child.wait()
    assert first["children_started"] == 0 and second["children_started"] == 1 and second["children"] >= 1
    assert second["rss_bytes"] > 0 and second["own_cpu_cores"] >= 0 and "cpu_count" in second


def test_first_opens_records_each_path_once_with_when(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x")
    with FirstOpens() as f:
        for _ in range(3):
            open(tmp_path / "a.bin", "rb").close()
        new, more = f.take()
        assert [p for _, p in new] == [str(tmp_path / "a.bin")] and more == 0
        open(tmp_path / "a.bin", "rb").close()
        assert f.take() == ([], 0)
