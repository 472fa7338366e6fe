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


@pytest.mark.parametrize("seed", SEEDS)
def test_killed_train_worker_resumes_with_its_data_position(chaos_cluster, tmp_path, seed):
    out = scenarios.train_worker_kill(tmp_path, seed)
    assert out.faults_injected == 1, out  # the kill landed while the job ran
    assert out.completed and not out.crashed, out.error
    assert out.details["epochs_checked"] == [0, 1]
    assert (out.samples_lost, out.samples_duplicated) == (0, 0), out.details
    # The trainers restarted from a checkpoint and the totals came from it: 2 epochs of samples, no replay.
    assert out.details["samples"] == 2 * 40 * scenarios.BATCH


@pytest.mark.parametrize("seed", SEEDS)
def test_killed_data_task_loses_and_repeats_nothing(chaos_cluster, tmp_path, seed):
    out = scenarios.data_worker_kill(tmp_path, seed)
    assert out.faults_injected == 1, out
    assert out.completed and not out.crashed, out.error
    assert (out.samples_lost, out.samples_duplicated) == (0, 0), out.details


@pytest.mark.parametrize("seed", SEEDS)
def test_killed_feed_service_is_restarted_and_the_job_resumes_exactly_once(chaos_cluster, tmp_path, seed):
    out = scenarios.feed_service_kill(tmp_path, seed)
    assert out.faults_injected == 1, out
    assert out.completed and not out.crashed, out.error
    assert (out.samples_lost, out.samples_duplicated) == (0, 0), out.details


def test_mlflow_outage_mid_run_buffers_and_flushes_every_metric(chaos_cluster, tmp_path):
    out = scenarios.mlflow_outage(tmp_path, seed=SEEDS[0])
    assert out.faults_injected == 1, out
    assert out.completed and not out.crashed, out.error
    assert out.details["steps_during_outage"] > 0, out.details  # training went on while the server was down
    assert out.details["metrics_complete"], out.details  # every step's loss once, none lost, none twice
