"""The events file: a header that marks it as gpuprof's, one line per event on disk as written,
nothing the user owns replaced, a line cut by a crash left out on reading."""

import json

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.watch.events import EventsFile, check_events_path, is_events_file, read_events


def test_header_then_one_line_per_event_readable_while_the_file_is_open(tmp_path):
    path = tmp_path / "ev.jsonl"
    ev = EventsFile(check_events_path(path))
    ev.open({"every": {"steps": 5}})
    ev.write({"kind": "window", "window": 1, "step_s": 0.01, "mfu": float("nan")})
    lines = path.read_text().splitlines()  # before close: flushed as written
    head, win = json.loads(lines[0]), json.loads(lines[1])
    assert lines[0].startswith('{"gpuprof": "watch-events", "schema": 1')
    assert head["kind"] == "header" and head["every"] == {"steps": 5} and head["tool"]["name"] == "gpuprof"
    assert win == {"kind": "window", "window": 1, "step_s": 0.01, "mfu": None}  # NaN is not JSON: null
    ev.close()
    assert is_events_file(path) and [e["kind"] for e in read_events(path)] == ["header", "window"]


@pytest.mark.parametrize("content", ["", "my notes\n", '{"kind": "window"}\n', '{"schema_version": 2, "tool": {"name": "gpuprof"}}'])
def test_an_existing_file_that_is_not_gpuprofs_events_is_refused(tmp_path, content):
    path = tmp_path / "ev.jsonl"
    path.write_text(content)
    with pytest.raises(GpuprofError) as e:
        check_events_path(path)
    assert "not a gpuprof events file" in str(e.value) and "\n" not in str(e.value)
    assert path.read_text() == content


def test_gpuprofs_own_events_file_is_replaced(tmp_path):
    path = tmp_path / "ev.jsonl"
    old = EventsFile(path)
    old.open({})
    old.write({"kind": "window", "window": 1})
    old.close()
    new = EventsFile(check_events_path(path))
    new.open({})
    new.close()
    assert [e["kind"] for e in read_events(path)] == ["header"]


def test_the_script_is_never_the_events_file(tmp_path):
    from gpuprof.files import same_file_key

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    with pytest.raises(GpuprofError, match="the script"):
        check_events_path(script, {same_file_key(script): "the script"})


def test_a_line_cut_short_by_a_crash_is_left_out(tmp_path):
    path = tmp_path / "ev.jsonl"
    ev = EventsFile(path)
    ev.open({})
    ev.write({"kind": "window", "window": 1})
    ev.close()
    with open(path, "a") as f:
        f.write('{"kind": "window", "wind')
    assert [e.get("window") for e in read_events(path)] == [None, 1]
