"""Typed warnings (planner/notices.py): text for people and JSON, a kind for front ends."""

from __future__ import annotations

import json
import pickle

from planner.notices import Kind, Notice, of_kind


def test_a_notice_is_its_text_and_keeps_its_kind():
    n = Notice("calibration x is stale: torch 2.11.0 (calibrated) != 2.13.0 (installed)",
               Kind.CALIBRATION_STALE)
    assert n == "calibration x is stale: torch 2.11.0 (calibrated) != 2.13.0 (installed)"
    assert json.dumps([n]) == json.dumps([str(n)])  # the JSON contract: a list of strings
    back = pickle.loads(pickle.dumps(n))  # the webhook's worker processes
    assert back == n and back.kind is Kind.CALIBRATION_STALE


def test_routing_is_by_kind_not_by_words():
    # a job note that happens to contain the word "stale" is not a stale calibration
    lines = [Notice("job.yaml: a stale checkpoint path is not read", Kind.JOB),
             Notice("calibration y is stale: CUDA 12.4 != 13.0", Kind.CALIBRATION_STALE),
             "a plain line"]
    assert of_kind(lines, Kind.CALIBRATION_STALE) == [lines[1]]
    assert of_kind(lines, Kind.JOB) == [lines[0]]


def test_the_request_types_its_warnings():
    from planner.fields import FLAGS
    from planner.request import build_request

    # calibration none: h100-80 has a shipped calibration, stale under any torch but 2.11
    r = build_request({"model.params": "13e9", "hardware.gpu": "h100-80", "hardware.n": 8,
                       "deepspeed.reduce_bucket_size": "auto", "calibration": "none"}, FLAGS)
    kinds = sorted(w.kind for w in r.warnings)
    assert kinds == [Kind.DEEPSPEED_AUTO, Kind.SHAPE_ASSUMED]
