"""The job summary's one-line descriptions (no Ray: the summary is plain data)."""

from __future__ import annotations

from dlrm_platform.job import describe_feed


def _pass(name="train", epoch=0, rows=141, first_block_s=2.0, produced_s=3.0, first_open_s=10.0):
    return {"name": name, "epoch": epoch, "generation": 1, "blocks": 18, "rows": rows,
            "first_block_s": first_block_s, "produced_s": produced_s, "first_open_s": first_open_s,
            "handed": {"0": rows}, "unbalanced": 0, "error": None}


def test_feed_line_says_the_first_pass_was_ready_before_the_trainers_asked():
    line = describe_feed({"passes": [_pass(), _pass("eval", rows=16), _pass(epoch=1)]})
    assert line == "2 train pass(es) run; epoch 0: 141 batches, all produced 7.0 s before the trainers asked"


def test_feed_line_says_when_the_trainers_waited():
    line = describe_feed({"passes": [_pass(produced_s=12.5, first_open_s=10.0)]})
    assert "trainers asked 2.5 s before its last batch (first after 2.0 s)" in line


def test_feed_line_without_passes():
    assert describe_feed({}) == "-"
    assert "epoch 3: 141 batches" in describe_feed({"passes": [_pass(epoch=3, produced_s=None)]})
