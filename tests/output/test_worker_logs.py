"""Forwarded worker output: each line's level, and the private Ray hook it relies on."""

from __future__ import annotations

import logging

from dlrm_platform.output import worker_logs
from dlrm_platform.output.worker_logs import classify_batch


def test_levels_of_forwarded_lines():
    lines = [
        "WARNING dlrm_platform.train.feed: epoch cache off: over its memory limit",
        "INFO dlrm_platform.train: epoch 0 step 20: loss 0.66",
        "[TBE=4b61e5ef] SplitTableBatchedEmbeddingBagsCodegen API: V2",
        "2026-11-23 05:33:53,490\tERROR worker.py:85 -- something broke",
        "2026/11/23 05:34:37 WARNING mlflow.pyfunc: Passing a Python object",
        "[2026-11-23 05:34:18,110 E 14241 14286] core_worker.cc:2465: Actor with class name",
    ]
    got = classify_batch(lines)
    assert got[0] == (logging.WARNING, "dlrm_platform.train.feed", "dlrm_platform.train.feed: epoch cache off: over its memory limit")
    assert got[1][:2] == (logging.INFO, "dlrm_platform.train")
    assert [level for level, _, _ in got[2:]] == [logging.INFO, logging.ERROR, logging.WARNING, logging.INFO]
    assert all(origin == "" for _, origin, _ in got[2:])


def test_a_traceback_and_the_rest_of_its_batch_are_warnings():
    got = classify_batch(["Failed to send resource request", "Traceback (most recent call last):",
                          '  File "x.py", line 1, in f', "ValueError: boom"])
    assert [level for level, _, _ in got] == [logging.INFO, logging.WARNING, logging.WARNING, logging.WARNING]


def test_ray_still_has_the_dispatcher_hook():
    """Fails loudly when a Ray upgrade moves the driver's forwarded-output dispatcher."""
    worker_logs.verify_hook()


def test_forwarding_turns_batches_into_records_and_restores_ray():
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("test.forwarded")
    logger.propagate = False
    logger.addHandler(Keep())
    logger.setLevel(logging.DEBUG)
    with worker_logs.forward_worker_output(logger):
        dispatcher.emit({"pid": 42, "actor_name": "RayTrainWorker", "ip": "10.0.0.2", "localhost": "10.0.0.1",
                         "is_err": True, "lines": ["WARNING dlrm_platform.train: careful", "plain"]})
    assert "emit" not in dispatcher.__dict__  # Ray's own method is back
    assert [r.getMessage() for r in records] == [
        "(RayTrainWorker pid=42, ip=10.0.0.2) dlrm_platform.train: careful",
        "(RayTrainWorker pid=42, ip=10.0.0.2) plain",
    ]
    assert records[0].levelno == logging.WARNING and records[0].origin == "dlrm_platform.train"


def test_worker_logging_format_is_what_the_driver_parses():
    logger = logging.getLogger("dlrm_platform")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        worker_logs.configure_worker_logging()
        worker_logs.configure_worker_logging()  # idempotent
        ours = [h for h in logger.handlers if getattr(h, "_dlrm_worker_handler", False)]
        assert len(ours) == 1 and not logger.propagate
        line = ours[0].format(logging.LogRecord("dlrm_platform.train.feed", logging.WARNING, __file__, 1,
                                                "cache off", None, None))
        assert classify_batch([line])[0][:2] == (logging.WARNING, "dlrm_platform.train.feed")
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])
