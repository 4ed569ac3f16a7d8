"""The rank that fell behind, named live: each rank's recorder reads the other ranks' events files
once per window (gpuprof.watch.ranks.PeerChanges) and matches their changes with its own. First
the reader on files written here (a file of an earlier launch, a line not yet complete), then a
recorder fed steps whose backward grows (the rank that waits) with a peer whose data grew."""

from __future__ import annotations

import json
import re
import socket
import urllib.request

import numpy as np

from gpuprof.watch.events import EventsFile
from gpuprof.watch.prometheus import Exporter
from gpuprof.watch.ranks import PEER_CHANGES_KEPT, PeerChanges, add_straggler_causes
from gpuprof.watch.recorder import Recorder
from gpuprof.watch.windows import Every

RUN = "5f0c"


def _change(at, phase, **kw):
    return {"kind": "change", "at_step": at, "direction": "slower", "phase": phase, "before_s": 0.01,
            "after_s": 0.07, "phase_before_s": 0.001, "phase_after_s": 0.061, **kw}


def _events(path, run_id, *events):
    f = EventsFile(path)
    f.open({"rank": 1, "run_id": run_id})
    for e in events:
        f.write(e)
    f.close()


def test_a_peer_file_of_an_earlier_launch_is_not_read_and_this_ones_is(tmp_path):
    path = tmp_path / "run.events.rank1.jsonl"
    _events(path, "an-earlier-launch", _change(20, "data"))
    peers = PeerChanges(0, {0: tmp_path / "run.events.rank0.jsonl", 1: path, 2: tmp_path / "missing.jsonl"}, RUN)
    assert set(peers.paths) == {1, 2}  # its own file is not a peer's
    assert peers.poll() == {} and peers.seen == set()
    _events(path, RUN, {"kind": "window", "window": 1}, _change(20, "data"))  # the launch rewrites it
    got = peers.poll()
    assert list(got) == [1] and got[1][0]["at_step"] == 20 and got[1][0]["phase"] == "data"
    assert peers.seen == {1}
    assert peers.poll()[1] == got[1]  # nothing new: nothing added twice
    peers.close()


def test_a_line_not_yet_complete_is_read_when_it_is(tmp_path):
    path = tmp_path / "r1.jsonl"
    _events(path, RUN)
    peers = PeerChanges(0, {1: path}, RUN)
    assert peers.poll() == {1: []}
    line = json.dumps(_change(31, "forward"))
    with open(path, "a") as f:
        f.write(line[:25])
        f.flush()
        assert peers.poll() == {1: []}
        f.write(line[25:] + "\n" + "{not json\n")
    assert [c["at_step"] for c in peers.poll()[1]] == [31]  # the broken line skipped, not the reader
    peers.close()


def test_only_the_last_changes_of_a_peer_are_kept(tmp_path):
    path = tmp_path / "r1.jsonl"
    _events(path, RUN, *[_change(10 * i, "data") for i in range(PEER_CHANGES_KEPT + 10)])
    got = PeerChanges(0, {1: path}, RUN).poll()[1]
    assert len(got) == PEER_CHANGES_KEPT and got[-1]["at_step"] == 10 * (PEER_CHANGES_KEPT + 9)


class Counters:
    def start(self):
        pass

    def read(self):
        return {"seconds": 1.0, "own_cpu_cores": 1.0, "read_bytes_s": 0.0, "children": 0, "children_started": 0}


class FakePeers:
    """PeerChanges' interface: rank 1's change (its data, at `at`) appears from the `from_poll`-th poll on."""

    rank = 0

    def __init__(self, at: int, from_poll: int):
        self.at, self.from_poll, self.polls = at, from_poll, 0

    def poll(self):
        self.polls += 1
        return {1: [_change(self.at, "data")]} if self.polls >= self.from_poll else {1: []}


def _waiting_rank(peers, shift_at=40, n=80):
    """Rank 0's recorder fed `n` steps of 10 ms whose backward grows by 12 ms from `shift_at` (it
    waits for rank 1 at the all-reduce), windows of 10 steps."""
    rng = np.random.default_rng(4)
    events: list = []
    rec = Recorder(Every(steps=10), 0, [events.append], counters=Counters(), peers=peers,
                   clock=iter(np.arange(0, 100, 0.05)).__next__)
    for i in range(n):
        back = 0.006 + (0.012 if i >= shift_at else 0.0) + rng.normal(0, 0.0002)
        rec.on_step({"index": i, "wall_s": 0.004 + back, "phases": {"data": 0.001, "forward": 0.003, "backward": back},
                     "tokens": 64, "micro_steps": 1})
    return rec, events


def test_a_peer_change_seen_later_names_the_rank_behind_once():
    peers = FakePeers(at=40, from_poll=7)  # rank 1's file holds its change only from window 7
    rec, events = _waiting_rank(peers)
    kinds = [(e["kind"], e.get("window")) for e in events if e["kind"] in ("change", "straggler")]
    changes = [e for e in events if e["kind"] == "change"]
    assert len(changes) == 1 and changes[0]["phase"] == "backward" and changes[0]["at_step"] == 40
    found_at = changes[0]["window"]
    assert found_at < 7 and kinds == [("change", found_at), ("straggler", 7)]  # once, not at windows 8
    s = next(e for e in events if e["kind"] == "straggler")
    assert s["rank"] == 0 and s["change_at_step"] == 40 and s["change_phase"] == "backward"
    assert s["cause"] == {"kind": "straggler", "evidence": {"rank": 1, "phase": "data", "at_step": 40,
                                                             "phase_before_s": 0.001, "phase_after_s": 0.061}}
    section = rec.section()
    assert section["stragglers_live"] == 1 and section["changes"][0]["causes"][0] == s["cause"]
    # after the run, every rank's sections together: the cause found live is not added again
    rank1 = {"changes": [_change(40, "data")]}
    add_straggler_causes([(0, section), (1, rank1)])
    assert sum(c["kind"] == "straggler" for c in section["changes"][0]["causes"]) == 1
    assert rank1["changes"][0]["causes"][0]["evidence"] == {"rank": 1, "self": True, "waited": [0]}


def test_a_peer_change_far_from_this_ranks_is_not_a_straggler():
    rec, events = _waiting_rank(FakePeers(at=10, from_poll=1))
    assert [e["at_step"] for e in events if e["kind"] == "change"] == [40]
    assert not [e for e in events if e["kind"] == "straggler"] and rec.section()["stragglers_live"] == 0


def test_a_peer_reader_that_raises_is_counted_never_raised():
    class Broken:
        rank = 0

        def poll(self):
            raise OSError("stale NFS handle")

    rec, events = _waiting_rank(Broken())
    assert rec.errors == {"peers": 8} and sum(e["kind"] == "window" for e in events) == 8


def test_the_rank_behind_is_a_metric():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = Exporter(port)
    ex.start()
    try:
        def value():
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            return re.search(r"^gpuprof_watch_straggler_rank (\S+)$", body, re.M)[1]

        assert value() == "NaN"
        ex.straggler(1)
        assert float(value()) == 1.0
    finally:
        ex.stop()
