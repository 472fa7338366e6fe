"""The controller: observation -> policy -> masked allocation, once per interval.

It holds no Ray objects, so it runs the same inside a Ray Data executor (via
``ray_hooks.TunerCallback``), in the simulator and in unit tests. One
controller lives per tuner id and process, so what a policy learned in epoch 1
carries into epoch 2 (each epoch is a new Ray Data execution).
"""

from __future__ import annotations

import math
import threading
import time

from dlrm_platform.tuner.actions import project
from dlrm_platform.tuner.control_file import write_control
from dlrm_platform.tuner.cost_shift import CostShiftDetector
from dlrm_platform.tuner.observe import Observation, RawSnapshot, WindowedObserver
from dlrm_platform.tuner.spec import Allocation, TunerSpec

MEM_PRESSURE_START = 0.9


def reward(obs: Observation) -> float:
    """Delivered samples/s, less penalties for memory pressure and spilling."""
    thr = obs.throughput
    pressure = max(0.0, obs.mem_fraction - MEM_PRESSURE_START) / (1.0 - MEM_PRESSURE_START)
    spill = 1.0 if obs.spill_rate > 0 else 0.0
    return thr * (1.0 - 0.5 * pressure - 0.5 * spill)


class Controller:
    def __init__(self, spec: TunerSpec):
        from dlrm_platform.tuner.policies import make_policy

        self.spec = spec
        self.cpus = {o.name: o.num_cpus for o in spec.ops}
        self.allocation: Allocation = project(spec.initial_allocation(), spec.ops, spec.cpu_budget)
        self.policy = make_policy(spec)
        opts = spec.options
        shift_tolerance = float(opts.get("cost_shift_tolerance", 0.3))
        self.observer = WindowedObserver(
            window_s=float(opts.get("window_s", 3.0)),
            settle_s=float(opts.get("settle_s", 1.0)),
            warmup_s=self.policy.measure_after_delivery_s,
            # the workers' time per row tells a cost shift within a block or two, where the slot-based
            # rates smear it over their windows (tuner/cost_shift.py); option ``cost_shift_tolerance``
            # (0.3, the default; 0: off). Live it no longer calls a contended lookup shifted and leaves the
            # steady suite as it was; recoveries within 30 s were 3 of 5 and 1 of 5 (tuner/README.md, run 55)
            cost_shifts=CostShiftDetector(tolerance=shift_tolerance) if shift_tolerance > 0 else None,
            # rates per slot from the workers' time per row, steadier than rows per occupied slot-second
            # over a few seconds of lumpy block completions (option ``share_window_s``, e.g. 20; 0, the
            # default: off). Off: live, in three of three contended_lookup runs after plumber's, rl grew the
            # lookup to 16 slots with it (3,250-4,050 samples/s; without, 5,950), tuner/README.md run 53
            share_window_s=float(opts.get("share_window_s", 0.0)) or None,
        )
        self.epoch = 0
        self.t0: float | None = None
        self.records: list[dict] = []
        self._bound: int | None = None
        self._lock = threading.Lock()
        self.last_obs: Observation | None = None
        self.mem_blocks = 0
        self.tuned: list[str] = list(self.cpus)
        #: rows per block now, where the pipeline's blocks can be resized while it runs
        self.block_rows: int | None = spec.block_rows.initial if spec.block_rows is not None else None
        if self.block_rows is not None:
            write_control(spec.block_rows.control_file, {"block_rows": self.block_rows})

    # -- binding to one live execution at a time
    def bind(self, key: int) -> bool:
        with self._lock:
            if self._bound is not None and self._bound != key:
                return False
            self._bound = key
            return True

    def unbind(self) -> None:
        with self._lock:
            self._bound = None

    # -- epochs
    def start_epoch(self, tuned: list[str] | None = None, fused: dict | None = None,
                    missing: list[str] | None = None) -> None:
        self.epoch += 1
        if self.t0 is None:
            self.t0 = time.time()
        self.observer.clear()
        self.observer.last_change_t = None
        self.last_obs = None  # the report at the end covers this execution only
        if tuned is not None:
            self.tuned = [n for n in self.cpus if n in tuned]
        self.policy.start_execution(self.epoch, [o for o in self.spec.ops if o.name in self.tuned])
        self._record({"type": "epoch_start", "allocation": dict(self.allocation),
                      "tuned": self.tuned, "fused": fused or {}, "missing": missing or []})
        for note in self.policy.pop_notes():
            self._record({"type": "note", **note})

    def end_epoch(self, how: str) -> None:
        self._record({"type": "epoch_end", "how": how, "allocation": dict(self.allocation)})
        self._record_report()

    def _record_report(self) -> None:
        """The Plumber-style bottleneck report of the execution's last observation."""
        obs = self.last_obs
        if obs is None:
            return
        try:
            from dlrm_platform.tuner.plumber import analyse

            specs = [o for o in self.spec.ops if o.name in obs.names]
            report = analyse(obs, specs, obs.budget)
            self._record({"type": "report", "report": report.to_dict(), "text": report.render()})
        except Exception as err:  # noqa: BLE001 - telemetry must never stop the pipeline
            self._record({"type": "report", "report": None, "text": f"no report: {err}"})

    # -- the loop
    def tick(self, snap: RawSnapshot, budget: float) -> Allocation | None:
        """Push a snapshot; returns the new allocation when it changed."""
        budget = min(budget, self.spec.cpu_budget)
        obs = self._observe(snap, budget)
        if obs is None:
            return None
        alloc = {n: self.allocation[n] for n in self.tuned}
        specs = [o for o in self.spec.ops if o.name in self.tuned]
        decision = None
        changed = None
        explanation = None
        if self.spec.controls:
            # a block-size step is being measured: a move of slots now would confound it
            proposal = None if self.policy.holds_allocation() else self.policy.decide(obs, dict(alloc), specs, budget)
            for note in self.policy.pop_notes():
                self._record({"type": "note", **note})
            if proposal is not None:
                caps = {o.name: o.capacity for o in obs.ops}
                proposal = project({n: proposal.get(n, alloc[n]) for n in alloc}, specs, budget, caps)
                if proposal != alloc:
                    changed = proposal
                    decision = {n: proposal[n] - alloc[n] for n in alloc if proposal[n] != alloc[n]}
                    try:
                        explanation = self.policy.explain(obs, dict(alloc), dict(proposal), specs, budget)
                    except Exception as err:  # noqa: BLE001 - an explanation must never stop a decision
                        explanation = {"bottleneck": obs.bottleneck(), "expected_gain": None,
                                       "text": f"no explanation: {err}"}
                    self.allocation.update(proposal)
                    self.observer.note_change(snap.t, list(decision))
            if self.block_rows is not None and decision is None:
                rows_move = self.policy.decide_block_rows(obs, dict(alloc))
                for note in self.policy.pop_notes():
                    self._record({"type": "note", **note})
                if rows_move is not None and int(rows_move[0]) != self.block_rows:
                    rows, explanation = int(rows_move[0]), rows_move[1]
                    decision = {"block_rows": rows - self.block_rows}
                    self.set_block_rows(rows, snap.t)
        self._record_tick(obs, decision, budget, explanation, snap)
        return dict(self.allocation) if changed is not None else None

    def observe_at_end(self, snap: RawSnapshot, budget: float) -> None:
        """Record the execution's last snapshot as a tick, without a decision, where no tick has
        observed it yet: a pass that ends before its second ``interval_s`` (the first snapshot only
        starts the window) still leaves its throughput, allocation and report on record. A longer
        one's record is left as its ticks took it: a reading taken while it drains is no steady figure."""
        if self.last_obs is not None:
            return
        budget = min(budget, self.spec.cpu_budget)
        obs = self._observe(snap, budget)
        if obs is not None:
            self._record_tick(obs, None, budget, None, snap)

    def _observe(self, snap: RawSnapshot, budget: float) -> Observation | None:
        self.observer.push(snap, {n: self.allocation[n] for n in self.tuned})
        alloc = {n: self.allocation[n] for n in self.tuned}
        obs = self.observer.observation(alloc, self.cpus, budget,
                                        samples_per_sink_row=float(self.spec.options.get("samples_per_sink_row", 1.0)))
        if obs is not None:
            self.last_obs = obs
        return obs

    def set_block_rows(self, rows: int, t: float) -> None:
        """Resize the blocks read from now on; every operator's per-slot figures start over."""
        spec = self.spec.block_rows
        assert spec is not None and self.block_rows is not None
        rows = max(int(rows), spec.min_rows)
        if spec.max_rows is not None:
            rows = min(rows, spec.max_rows)
        self.block_rows = rows
        write_control(spec.control_file, {"block_rows": rows})  # read by the tasks that start from now on
        self.observer.note_change(t)
        self.policy.on_block_rows_change()

    def note_applied(self, applied: dict) -> None:
        if applied:
            self._record({"type": "applied", "detail": applied})

    def note_memory_blocks(self, n: int) -> None:
        self.mem_blocks = n

    # -- records
    def _record(self, rec: dict) -> None:
        rec.setdefault("t", time.time())
        rec["elapsed"] = rec["t"] - (self.t0 or rec["t"])
        rec["tuner_id"] = self.spec.tuner_id
        rec["policy"] = self.spec.policy
        rec["epoch"] = self.epoch
        self.records.append(rec)

    def _record_tick(self, obs: Observation, decision: dict | None, budget: float,
                     explanation: dict | None = None, snap: RawSnapshot | None = None) -> None:
        per_op = {}
        for o in obs.ops:
            raw = snap.ops.get(o.name) if snap is not None else None
            per_op[o.name] = {
                "slots": o.slots,
                "out_rate": o.out_rate,
                "rate_per_slot": o.rate_per_slot,
                "capacity": o.capacity,
                "util": o.util,
                "running": o.running,
                "queue_blocks": o.queue_blocks,
                "queue_bytes": o.queue_bytes,
                "backpressure": o.backpressure,
                "pool_util": o.pool_util,
                "pool_size": o.pool_size,
                "tasks_now": o.tasks_now,
                "throttled": o.throttled,
                "element_ratio": o.element_ratio,
                # the cumulative counters, so that a recorded run can be replayed against a new signal
                "rows_out_total": raw.rows_out if raw is not None else None,
                "busy_s_total": raw.busy_seconds if raw is not None else None,
                "slot_s_total": raw.slot_seconds if raw is not None else None,
            }
        self._record({
            "type": "tick",
            "throughput": obs.throughput,
            "window_s": obs.window_s,
            "allocation": dict(self.allocation),
            "per_op": per_op,
            "mem_used": obs.mem_used,
            "mem_limit": obs.mem_limit if math.isfinite(obs.mem_limit) else None,
            "mem_fraction": obs.mem_fraction,
            "spill_rate": obs.spill_rate,
            "data_wait": obs.data_wait,
            "budget": budget,
            "reward": reward(obs),
            "decision": decision,
            "explanation": explanation,
            "policy_state": self.policy.describe(),
            "memory_guard_blocks": self.mem_blocks,
            "block_rows": self.block_rows,
            "bottleneck": obs.bottleneck(),
            # operator -> new / old cost per row, told this tick from the workers' clocks (tuner/cost_shift.py)
            "cost_shifts": dict(obs.extra.get("cost_shifts") or {}) or None,
        })

    def pop_records(self) -> list[dict]:
        out, self.records = self.records, []
        return out
