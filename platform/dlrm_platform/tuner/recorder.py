"""Telemetry of a tuner: a small Ray actor that collects decisions and throughput,
and the driver-side :class:`TunerHandle` that reads them back, plots them and
logs them to MLflow.

The controller runs wherever the dataset executes (the job's feed service
actor, ``ingest/feed_service.py``); it sends its records to the recorder actor, fire-and-forget,
once per interval. Train workers report their data-wait fraction to the same
actor (:meth:`TunerHandle.reporter`), and the controller reads it back as part
of its observation.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from dlrm_platform.tuner.spec import TunerSpec

log = logging.getLogger(__name__)

NAMESPACE = "dlrm_platform_tuner"


def recorder_name(tuner_id: str) -> str:
    return f"dlrm-tuner-{tuner_id}"


class _Recorder:
    def __init__(self, max_records: int = 200_000):
        self.records: list[dict] = []
        self.max_records = max_records
        self.waits: dict[int, tuple[float, float]] = {}

    def record(self, records: list[dict]) -> None:
        self.records.extend(records)
        if len(self.records) > self.max_records:
            del self.records[: len(self.records) - self.max_records]

    def get(self, since: int = 0) -> list[dict]:
        return self.records[since:]

    def count(self) -> int:
        return len(self.records)

    def report_data_wait(self, rank: int, fraction: float) -> None:
        self.waits[int(rank)] = (time.time(), float(fraction))

    def data_wait(self, max_age_s: float = 30.0) -> float | None:
        now = time.time()
        fresh = [f for t, f in self.waits.values() if now - t <= max_age_s]
        return sum(fresh) / len(fresh) if fresh else None


def start_recorder(tuner_id: str):
    import ray

    cls = ray.remote(num_cpus=0, max_concurrency=4)(_Recorder)
    return cls.options(name=recorder_name(tuner_id), namespace=NAMESPACE, get_if_exists=True).remote()


class DataWaitReporter:
    """Picklable: pass it to Train workers; they call ``report(fraction, rank)``."""

    def __init__(self, tuner_id: str):
        self.tuner_id = tuner_id
        self._actor = None

    def report(self, fraction: float, rank: int = 0) -> None:
        try:
            if self._actor is None:
                import ray

                self._actor = ray.get_actor(recorder_name(self.tuner_id), namespace=NAMESPACE)
            self._actor.report_data_wait.remote(rank, fraction)
        except Exception as err:  # noqa: BLE001 - telemetry must never break training
            log.debug("data-wait report failed: %s", err)

    def __getstate__(self):
        return {"tuner_id": self.tuner_id, "_actor": None}


class TunerHandle:
    """What :func:`dlrm_platform.tuner.attach` returns to the driver."""

    def __init__(self, spec: TunerSpec, recorder=None):
        self.spec = spec
        self.tuner_id = spec.tuner_id
        self.policy = spec.policy
        self._recorder = recorder
        self._cache: list[dict] = []

    # -- reading
    def history(self) -> list[dict]:
        """Every record so far (ticks, epoch starts/ends, applied changes)."""
        if self._recorder is not None:
            import ray

            try:
                new = ray.get(self._recorder.get.remote(len(self._cache)), timeout=30)
                self._cache.extend(new)
            except Exception as err:  # noqa: BLE001
                log.warning("tuner recorder unreachable: %s", err)
        else:
            from dlrm_platform.tuner.ray_hooks import local_controller

            ctl = local_controller(self.tuner_id)
            if ctl is not None:
                self._cache.extend(ctl.pop_records())
        return list(self._cache)

    def ticks(self) -> list[dict]:
        return [r for r in self.history() if r.get("type") == "tick"]

    def reporter(self) -> DataWaitReporter:
        return DataWaitReporter(self.tuner_id)

    def summary(self) -> dict[str, Any]:
        ticks = self.ticks()
        out: dict[str, Any] = {"tuner_id": self.tuner_id, "policy": self.policy, "ticks": len(ticks)}
        if not ticks:
            return out
        thr = [t["throughput"] for t in ticks]
        tail = thr[len(thr) // 2:]
        out.update({
            "final_allocation": ticks[-1]["allocation"],
            "mean_samples_per_s": sum(thr) / len(thr),
            "steady_samples_per_s": sum(tail) / len(tail),
            "peak_mem_used": max(t["mem_used"] for t in ticks),
            "decisions": sum(1 for t in ticks if t.get("decision")),
            "epochs": max(t["epoch"] for t in ticks),
        })
        shifts = self.cost_shifts()
        if shifts:
            out["cost_shifts"] = len(shifts)
        held = self.held()
        if held:
            out["held"] = len(held)
        choices = [{"epoch": r.get("epoch"), "choice": r.get("choice"), "reason": r.get("reason")}
                   for r in self.history() if r.get("type") == "note" and r.get("choice")]
        if choices:
            out["choices"] = choices
        return out

    def decisions(self) -> list[dict]:
        """Every move: when, the change, the allocation after it, and its explanation (bottleneck, expected gain)."""
        out = []
        for t in self.ticks():
            if t.get("decision"):
                ex = t.get("explanation") or {}
                out.append({"elapsed_s": t.get("elapsed"), "epoch": t.get("epoch"), "change": t["decision"],
                            "allocation": t["allocation"], "samples_per_s_before": t.get("throughput"),
                            "bottleneck": ex.get("bottleneck") or t.get("bottleneck"),
                            "expected_gain": ex.get("expected_gain"), "why": ex.get("text")})
        return out

    def cost_shifts(self) -> list[dict]:
        """Every cost shift told (``tuner/cost_shift.py``): when, the operator, its new / old cost per row, and
        its slots then (before the tick's own move)."""
        def before(t: dict, name: str) -> int | None:
            slots = (t.get("allocation") or {}).get(name)
            return None if slots is None else slots - (t.get("decision") or {}).get(name, 0)

        return [{"elapsed_s": t.get("elapsed"), "epoch": t.get("epoch"), "operator": name, "ratio": ratio,
                 "slots": before(t, name)}
                for t in self.ticks() for name, ratio in (t.get("cost_shifts") or {}).items()]

    def held(self) -> list[dict]:
        """Plans the policy held back (plumber's hysteresis): the allocation, its predicted and required gain, why."""
        return [{"elapsed_s": r.get("elapsed"), "epoch": r.get("epoch"), "allocation": r["held"],
                 "predicted_gain": r.get("predicted_gain"), "required_gain": r.get("required_gain"),
                 "reason": r.get("reason")}
                for r in self.history() if r.get("type") == "note" and r.get("held")]

    def report(self, epochs: list[dict] | None = None) -> str:
        """The run's tuner report: the policy's choice, its decisions, the bottleneck report of each
        execution of the train pipeline the tuner saw (numbered from 1; a job's epochs from 0), and the epochs no pipeline ran for (``epochs``: the job's per-epoch
        ``source``, ``pipeline`` or ``cache``)."""
        records = self.history()
        lines = [f"tuner policy: {self.policy} (tuner {self.tuner_id})"]
        for r in records:
            if r.get("type") == "note" and r.get("choice"):
                lines.append(f"pipeline execution {r.get('epoch')}: {self.policy} chose {r['choice']}: "
                             f"{r.get('reason', '')}")
        for e in epochs or []:
            if e.get("source") == "cache":
                lines.append(f"training epoch {e.get('epoch')}: replayed from the epoch cache; no pipeline ran, "
                             "nothing to tune")
        moves = self.decisions()
        lines += ["", f"decisions: {len(moves)}"]
        for d in moves:
            change = ", ".join(f"{op} {delta:+d}" for op, delta in d["change"].items())
            lines.append(f"  t={d['elapsed_s'] or 0:.1f}s execution {d['epoch']}: {change} -> {d['allocation']}; "
                         f"{d.get('why') or 'bottleneck ' + str(d.get('bottleneck'))}")
        shifts = self.cost_shifts()
        if shifts:
            lines += ["", f"cost shifts told: {len(shifts)} (an operator's cost per row, by its workers' clocks)"]
            for c in shifts:
                lines.append(f"  t={c['elapsed_s'] or 0:.1f}s execution {c['epoch']}: {c['operator']} costs "
                             f"{c['ratio']:.2f}x per row what it did, at {c['slots']} slots")
        held = self.held()
        if held:
            lines += ["", f"plans held back: {len(held)} (a move must clear the noise of the rates it rests on)"]
            for h in held[-10:]:
                lines.append(f"  t={h['elapsed_s'] or 0:.1f}s execution {h['epoch']}: {h['allocation']} predicted "
                             f"{h['predicted_gain']:+.0%}, needed {h['required_gain']:+.0%}: {h['reason']}")
        reports = [r for r in records if r.get("type") == "report"]
        for i, r in enumerate(reports, 1):
            lines += ["", f"bottleneck report, pipeline execution {r.get('epoch')} ({i} of {len(reports)}):",
                      r.get("text", "")]
        if not reports:
            lines += ["", "bottleneck report: none (no execution ran long enough to be observed)"]
        return "\n".join(lines) + "\n"

    # -- outputs
    def plot(self, path: str | Path, title: str | None = None) -> Path:
        return plot_history(self.ticks(), path, title or f"tuner {self.policy} ({self.tuner_id})")

    def log_to_mlflow(self, client=None, run_id: str | None = None, artifact_dir: str | Path | None = None,
                      epochs: list[dict] | None = None) -> None:
        """Metrics ``tuner/samples_per_s``, ``tuner/slots/<op>``, ``tuner/mem_fraction`` per tick
        (step = tick index), plus the artifacts ``tuner_allocation.png`` (allocation and samples/s over
        time), ``tuner_history.json`` (every record), ``tuner_decisions.json`` (each move with its
        bottleneck and expected gain) and ``tuner_report.txt`` (:meth:`report`)."""
        import tempfile

        import mlflow
        from mlflow.entities import Metric

        client = client or mlflow.tracking.MlflowClient()
        run_id = run_id or mlflow.active_run().info.run_id
        ticks = self.ticks()
        metrics: list[Metric] = []
        for i, t in enumerate(ticks):
            ts = int(t["t"] * 1000)
            metrics.append(Metric("tuner/samples_per_s", float(t["throughput"]), ts, i))
            metrics.append(Metric("tuner/mem_fraction", float(t["mem_fraction"]), ts, i))
            for name, n in t["allocation"].items():
                metrics.append(Metric(f"tuner/slots/{name}", float(n), ts, i))
            if t.get("block_rows") is not None:
                metrics.append(Metric("tuner/block_rows", float(t["block_rows"]), ts, i))
            if t.get("data_wait") is not None:
                metrics.append(Metric("tuner/data_wait", float(t["data_wait"]), ts, i))
        for start in range(0, len(metrics), 900):
            client.log_batch(run_id, metrics=metrics[start:start + 900])
        tmp = Path(artifact_dir) if artifact_dir else Path(tempfile.mkdtemp(prefix="tuner-"))
        tmp.mkdir(parents=True, exist_ok=True)
        png = self.plot(tmp / "tuner_allocation.png")
        js = tmp / "tuner_history.json"
        js.write_text(json.dumps(self.history(), default=_json_default))
        decisions = tmp / "tuner_decisions.json"
        decisions.write_text(json.dumps(self.decisions(), default=_json_default, indent=1))
        report = tmp / "tuner_report.txt"
        report.write_text(self.report(epochs))
        for path in (png, js, decisions, report):
            client.log_artifact(run_id, str(path))

    def close(self) -> None:
        if self._recorder is not None:
            import ray

            try:
                ray.kill(self._recorder)
            except Exception:  # noqa: BLE001
                pass
            self._recorder = None


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def plot_history(ticks: list[dict], path: str | Path, title: str = "tuner") -> Path:
    """Allocation per operator (top) and samples/s (bottom) against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if ticks:
        t0 = ticks[0]["t"]
        xs = [t["t"] - t0 for t in ticks]
        names = list(ticks[0]["allocation"])
        for n in names:
            ax1.step(xs, [t["allocation"].get(n, 0) for t in ticks], where="post", label=n)
        ax2.plot(xs, [t["throughput"] for t in ticks], color="black", lw=1)
        epochs = [(x, t["epoch"]) for x, t in zip(xs, ticks)]
        for (x0, e0), (x1, e1) in zip(epochs, epochs[1:]):
            if e1 != e0:
                for ax in (ax1, ax2):
                    ax.axvline(x1, color="grey", ls=":", lw=0.8)
        ax1.legend(loc="upper left", fontsize=8, ncol=3)
        rows = [t.get("block_rows") for t in ticks]
        if any(r is not None for r in rows) and len({r for r in rows if r is not None}) > 1:
            ax3 = ax1.twinx()  # resizable blocks: the tuner's second knob
            ax3.step(xs, [r or 0 for r in rows], where="post", color="grey", ls="--", lw=1.2,
                     label="rows per block")
            ax3.set_ylabel("rows per block (dashed)")
            ax3.legend(loc="upper right", fontsize=8)
    ax1.set_ylabel("slots (tasks/actors)")
    ax2.set_ylabel("samples/s")
    ax2.set_xlabel("seconds")
    ax1.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
