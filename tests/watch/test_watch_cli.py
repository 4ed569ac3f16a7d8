"""`gpuprof watch` from the command line: bad input is one line and exit 2 (nothing of the user's
changed); the report is diagnose's with the changes after it; the Prometheus endpoint is scraped
over loopback while the run goes; a run killed with `kill -9` keeps every finished window."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.watch.events import read_events

runner = CliRunner()
FAST = ["--no-samplers", "--post-budget", "0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_exit_2(res):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpuprof: error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


@pytest.mark.parametrize("every", ["3", "10 parsecs", "0s"])
def test_a_bad_every_is_one_line(script, every):
    assert "--every" in _one_line_exit_2(runner.invoke(app, ["watch", "--every", every, str(script)]))


def test_an_events_file_not_written_by_gpuprof_is_refused_and_kept(script, tmp_path):
    mine = tmp_path / "metrics.jsonl"
    mine.write_text('{"loss": 3.2}\n')
    line = _one_line_exit_2(runner.invoke(app, ["watch", "--events", str(mine), *FAST, str(script)]))
    assert "not a gpuprof events file" in line and mine.read_text() == '{"loss": 3.2}\n'


def test_the_script_is_never_the_events_file(script):
    assert "the script" in _one_line_exit_2(runner.invoke(app, ["watch", "--events", str(script), str(script)]))


def test_a_port_in_use_is_one_line(script, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = _one_line_exit_2(runner.invoke(app, ["watch", "--prometheus", str(port), *FAST, str(script)]))
    assert f"--prometheus {port}: cannot listen on 127.0.0.1:{port}" in line
    assert not (tmp_path / "ev.jsonl").exists()


def test_no_such_script_is_one_line(tmp_path):
    assert "no such file" in _one_line_exit_2(runner.invoke(app, ["watch", str(tmp_path / "nope.py")]))


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_the_report_then_the_changes_and_the_metrics_scraped_over_loopback(script, tmp_path):
    port, scraped, events = _free_port(), tmp_path / "scraped.txt", tmp_path / "ev.jsonl"
    res = runner.invoke(app, ["watch", "--every", "5steps", "--events", str(events), "--prometheus", str(port),
                              *FAST, str(script), "--max_iters=60", "--slow_from=30", "--delay=0.02", "--slow_delay=0.08",
                              f"--scrape_port={port}",
                              "--scrape_at=24", f"--scrape_out={scraped}"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())
    assert "gpuprof diagnosis:" in out and "What changed over the run (gpuprof watch)" in out
    changed = out[out.index("What changed over the run (gpuprof watch)"):]
    # the loader's slowdown at step 30, named with data; on a quiet machine the rule can also flag a
    # ~1 ms shift of these steady steps before it (seen once in the full suite: a known gap,
    # docs/watch.md), so the data change is looked for among the changes, not only first. One found at
    # step 22 (+1.6 ms of 12.7-ms steps, CI 2026-12-07) left too few windows to find the one at 30: the
    # sleeps are 20 ms and 80 ms (were 10 and 40), so the same host noise is half the share of a step
    assert re.search(r"\d\. change at step 3[01] \(found at the close of window \d+\): slower, [^;]+; data ",
                     changed), changed[:1500]
    assert "the rule: Pettitt's rank test" in out
    # the console wraps a long path anywhere (pytest-xdist's tmp paths are longer): compare unwrapped
    assert f"events(oneJSONobjectperline)writtento{events}".replace(" ", "") in "".join(res.stdout.split())
    assert "gpuprof: window 1 (steps 2–6, 5 steps)" in " ".join(res.stderr.split())  # the live lines
    body = scraped.read_text()
    m = _metrics(body)
    # at iter 24 the last closed window is the 4th (steps 17-21): the metrics are its figures
    w4 = next(e for e in read_events(events) if e["kind"] == "window" and e["window"] == 4)
    assert m["gpuprof_watch_window"] == 4 and m["gpuprof_watch_last_step"] == 21
    assert m["gpuprof_watch_step_seconds"] == pytest.approx(w4["step_s"])
    assert m['gpuprof_watch_phase_share{phase="data"}'] == pytest.approx(w4["phases"]["data"]["share"])
    assert m["gpuprof_watch_tokens_per_second"] == pytest.approx(w4["tokens_per_s"])
    assert m["gpuprof_watch_changes_total"] == 0
    # figures only: no path, script name, command line or environment; no default collectors
    for secret in (str(tmp_path), "train.py", "scrape_port", os.environ.get("HOME", "/root"), "python_info", "process_"):
        assert secret not in body
    with pytest.raises(OSError):  # the server is gone after the run
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_ctrl_c_gives_the_report_over_the_steps_so_far_and_exit_130(script, tmp_path):
    events = tmp_path / "ev.jsonl"
    res = runner.invoke(app, ["watch", "--every", "5steps", "--events", str(events), *FAST, str(script),
                              "--max_iters=1000", "--interrupt_at=21"])
    assert res.exit_code == 130, res.output
    assert "gpuprof diagnosis (partial):" in res.stdout and "What changed over the run (gpuprof watch)" in res.stdout
    assert res.stderr.strip().endswith("gpuprof: interrupted")
    evs = read_events(events)
    windows = [e for e in evs if e["kind"] == "window"]
    assert [w["steps"] for w in windows[:4]] == [[2, 6], [7, 11], [12, 16], [17, 21]]
    assert evs[-1]["kind"] == "end" and evs[-1]["ended"] == "interrupted"


def test_a_run_killed_with_kill_9_keeps_every_finished_window(script, tmp_path):
    events, log = tmp_path / "ev.jsonl", tmp_path / "stdout.txt"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpuprof", "watch", "--every", "3steps", "--events",
                                 str(events), *FAST, str(script), "--max_iters=100000", "--delay=0.003"],
                                stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if events.exists() and events.read_text().count('"kind": "window"') >= 6:
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
    printed = [int(n) for n in re.findall(r"^iter (\d+):", log.read_text(), re.M)]
    raw = events.read_text()
    complete = raw if raw.endswith("\n") else raw[: raw.rfind("\n") + 1]
    parsed = [json.loads(line) for line in complete.splitlines()]  # every whole line is valid JSON
    assert parsed[0]["gpuprof"] == "watch-events" and parsed == read_events(events)
    windows = [e for e in parsed if e["kind"] == "window"]
    assert len(windows) >= 6 and [w["window"] for w in windows] == list(range(1, len(windows) + 1))
    assert all(w["steps"][0] == v["steps"][1] + 1 for v, w in zip(windows, windows[1:]))
    # the script printed iter L after step L closed: every window that ended by then is on disk
    assert windows[-1]["steps"][1] >= max(printed) - 2
    assert not any(e["kind"] == "end" for e in parsed)  # killed: no end event, nothing after


@pytest.mark.parametrize("args, says", [
    (["--pid", "999999999"], "999999999"),
    (["--pid", str(os.getpid()), "--every", "100steps"], "give a duration"),
    (["--pid", str(os.getpid()), "--every", "0.5s"], "at least 1 s"),
    (["--pid", str(os.getpid()), "--rate", "0"], "--rate"),
])
def test_watch_pid_bad_input_is_one_line(args, says):
    assert says in _one_line_exit_2(runner.invoke(app, ["watch", *args]))


def test_watch_pid_and_a_script_together_is_one_line(script):
    assert "not both" in _one_line_exit_2(runner.invoke(app, ["watch", "--pid", str(os.getpid()), str(script)]))


def test_watch_without_a_script_or_a_pid_is_one_line():
    assert "--pid PID" in _one_line_exit_2(runner.invoke(app, ["watch"]))


def test_torchrun_options_need_nproc_per_node(script):
    assert "--nproc-per-node" in _one_line_exit_2(runner.invoke(app, ["watch", "--standalone", str(script)]))
