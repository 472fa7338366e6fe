"""Faults from outside, on a real job: a killed trainer, a killed data task, an MLflow outage.

Each test runs one scenario of :mod:`scenarios` with a fixed seed (the fault's
point is drawn from it) and checks the exact count: every sample of every epoch
trained once, none lost, none twice. ``make chaos`` runs them with more seeds
(``DLRM_CHAOS_SEEDS``); ``benchmarks/chaos.py`` reports the counts.
"""

from __future__ import annotations

import os

import pytest

import scenarios

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
SEEDS = [int(s) for s in os.environ.get("DLRM_CHAOS_SEEDS", "7").split(",")]


KILLS = {  # scenario: what dies; each must still train every sample of every epoch exactly once
    "train_worker_kill": "a Ray Train worker (the group resumes from its checkpoint with the data position)",
    "data_worker_kill": "a Ray Data task's process (Ray retries it, or the trainers resume)",
    "feed_service_kill": "the job's feed service actor (Ray restarts it, the trainers resume)",
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", list(KILLS))
def test_killed_process_loses_and_repeats_no_sample(ray_cluster, tmp_path, scenario, seed):
    out = getattr(scenarios, scenario)(tmp_path, seed)
    assert out.faults_injected == 1, out  # the kill landed while the job ran
    assert out.completed and not out.crashed, out.error
    assert out.details["epochs_checked"] == [0, 1]
    assert (out.samples_lost, out.samples_duplicated) == (0, 0), out.details
    if scenario == "train_worker_kill":
        # The trainers restarted from a checkpoint and the totals came from it: 2 epochs of samples, no replay.
        assert out.details["samples"] == 2 * 40 * scenarios.BATCH


def test_mlflow_outage_mid_run_buffers_and_flushes_every_metric(ray_cluster, tmp_path):
    out = scenarios.mlflow_outage(tmp_path, seed=SEEDS[0])
    assert out.faults_injected == 1, out
    assert out.completed and not out.crashed, out.error
    assert out.details["steps_during_outage"] > 0, out.details  # training went on while the server was down
    assert out.details["metrics_complete"], out.details  # every step's loss once, none lost, none twice


# The final model after a kill vs. an unfailed run from the checkpoint the killed run resumed from, as a
# fraction of how far the unfailed run moved the model from that checkpoint. Both train the same remaining
# batches from the same state; only the order and the split between the two workers differ (the feed service
# serves whichever worker asks first), which moves the result by far less than the training itself. A resume
# that lost the optimizer state, restarted the model from scratch, or skipped or repeated a stretch of batches
# lands about as far off as the training moved it (ratio ~1 and above).
# Measured (seed 7, 2026-11-23): distance 0.0 for 4.90 moved, bit-identical: the dense gradients of a step
# are summed over the two workers (a sum of two is the same either way round) and the batches came in the
# same order. The bound stays loose because the feed service does not promise that order under load.
MAX_REL_DIFF = 0.5


def test_killed_train_worker_ends_where_an_unfailed_run_from_the_same_checkpoint_does(ray_cluster, tmp_path):
    out = scenarios.train_worker_kill_vs_unfailed(tmp_path, SEEDS[0])
    print("model comparison", {k: v for k, v in out.details.items() if k.startswith(("model", "faulted"))})
    assert out.faults_injected == 1, out
    assert out.completed and not out.crashed, out.error
    assert out.details["model_moved"] > 0, out.details  # the unfailed run trained after the checkpoint
    assert out.details["model_rel_diff"] <= MAX_REL_DIFF, out.details
