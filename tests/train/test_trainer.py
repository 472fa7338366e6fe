"""The driver side of training (``train/trainer.py``): what it costs a job before its workers run."""

from __future__ import annotations

import subprocess
import sys

from dlrm_platform.train.trainer import CONTROLLER_POLL_S, poll_controller_often


def test_the_driver_imports_no_torchrec():
    # The job's driver needs the trainer and the checkpoint checks, not the model: TorchRec and fbgemm
    # took seconds of every job's start before the workers' entry imported the loop itself.
    code = ("import sys, dlrm_platform.train.trainer, dlrm_platform.train.checkpoint, dlrm_platform.job; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torchrec', 'fbgemm_gpu')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stdout[-2000:]


def test_the_controller_polls_often_unless_the_user_says_otherwise():
    env: dict[str, str] = {}
    assert poll_controller_often(env) == str(CONTROLLER_POLL_S)
    assert float(env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"]) < 2.0  # Ray's default held each report up to 2 s
    mine = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "3"}
    assert poll_controller_often(mine) == "3" and mine == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "3"}
