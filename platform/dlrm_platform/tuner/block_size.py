"""Rows per block as a second knob: larger blocks while each task's fixed cost pays.

Every task pays a fixed cost whatever its rows: Ray's dispatch and object-store round
trips (100-160 ms per task on the 2-core development machine), a storage request's
latency, a per-call setup. With small blocks that cost can be most of a slot's time,
and no allocation of slots recovers it: only fewer, larger blocks do. Larger blocks
hold more object-store memory, so every step is masked against the store's limit.

:class:`BlockSizer` steers it from measurements, in steps while the allocation holds:

* Per operator and block size it keeps the seconds a slot is occupied per task,
  ``T(B) = rows per task / rows per occupied slot-second``, and fits
  ``T(B) = fixed + per_row * B`` once two block sizes are measured. Before that the
  fixed part is what Ray adds outside the task (occupied minus worker-measured busy
  time); a fixed cost inside the task (a storage request) shows only across sizes, so
  the first step is a probe, to the largest size allowed (up to 16x).
* The predicted throughput at ``B'`` is the slowest operator's capacity there
  (slots x rows per task / ``T(B')``); a step goes to the size with the largest
  predicted gain if that is at least ``min_gain``, and names the bottleneck operator,
  its fixed cost per task and the gain (the decision's explanation).
* Each step is judged by the delivered throughput at one allocation: the allocation is held
  while the throughput before the step (where the allocation policy left no quiet stretch)
  and after it are measured, and a step that delivered clearly less than the size it left
  is undone, and that size and larger ones are not tried again for ``ban_s``.
* The allocation holds from the start until the first step is judged (or none is worth one):
  what the start-up's rates suggest is wrong at the size the sizer goes on to choose.
* Every step is masked against the object store: the running tasks' input and output blocks
  must fit half its limit; past that (more slots since) it halves the blocks, never below the
  initial size.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from dlrm_platform.tuner.observe import Observation
from dlrm_platform.tuner.spec import BlockRowsSpec

WORKING_SET_SHARE = 0.5  # the running tasks' blocks may take this share of the object-store limit


def doubled_sizes(rows: int, top: int) -> list[int]:
    """``rows``, then doubled while at most ``top``: the block sizes a tuner steps between."""
    sizes = [rows]
    while 2 * sizes[-1] <= top:
        sizes.append(2 * sizes[-1])
    return sizes


@dataclass
class _Trial:
    t: float          # when the step was made
    before_rows: int
    after_rows: int
    before: float     # delivered samples/s at before_rows (same allocation)


@dataclass
class OpTaskTimes:
    """One operator's occupied slot-seconds and tasks finished at each block size measured; the
    seconds per task are their ratio (sums, not a mean of per-interval ratios: an interval in
    which a long task finishes and one in which none does are both real)."""

    slot_s: dict[int, float] = field(default_factory=dict)
    tasks: dict[int, float] = field(default_factory=dict)
    ray_fixed: float | None = None  # occupied minus busy seconds per task (Ray's share of the fixed cost)

    def add(self, rows: int, slot_seconds: float, tasks: float) -> None:
        self.slot_s[rows] = self.slot_s.get(rows, 0.0) + slot_seconds
        self.tasks[rows] = self.tasks.get(rows, 0.0) + tasks

    def means(self, min_tasks: float = 2.0) -> dict[int, float]:
        """Occupied seconds per task at each size with at least ``min_tasks`` tasks finished."""
        return {b: self.slot_s[b] / n for b, n in self.tasks.items() if n >= min_tasks}

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_row)`` seconds per task over the block sizes measured (one size: ``ray_fixed``
        as the fixed part, the rest per row); None before any."""
        pts = self.means()
        if not pts:
            return None
        if len(pts) == 1:
            (b, t), = pts.items()
            fixed = min(max(self.ray_fixed or 0.0, 0.0), t)
            return fixed, (t - fixed) / b
        xs, ys = list(pts), [pts[b] for b in pts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
        slope = max(slope, 0.0)
        fixed = max(my - slope * mx, 0.0)
        return fixed, slope


def held_samples(obs: Observation, rows: int) -> float:
    """Samples the pipeline holds in blocks of ``rows`` read rows: queued before each operator or in
    its running tasks. They reach the sink before any block read after a change of size."""
    factors = obs.extra.get("sink_factors") or [1.0] * len(obs.ops)
    if not obs.ops:
        return 0.0
    per_block = rows * factors[0]  # samples one block read becomes
    # the read's own input queue holds what is still to be read (file names, row-group ids), no rows
    blocks = obs.ops[0].tasks_now + sum(o.queue_blocks + o.tasks_now for o in obs.ops[1:])
    return blocks * per_block


def fill_seconds(obs: Observation, old_rows: int, new_rows: int,
                 fits: dict[str, tuple[float, float]] | None = None) -> float:
    """Seconds the first block of ``new_rows`` takes through every operator: until it reaches the
    sink, the sink sees a gap that is no measure of the new size. An operator's seconds per task
    come from its fitted ``(fixed, per_row)`` where ``fits`` has it, else its occupied seconds per
    task now scaled by the size ratio (an upper bound: its fixed part does not scale; with 500-row
    tasks at 0.2-0.4 s each, 16x that overstated the fill by about 2x live)."""
    total = 0.0
    for o in obs.ops:
        if o.completed:
            continue
        if fits and o.name in fits:
            fixed, per_row = fits[o.name]
            total += fixed + per_row * max(new_rows, old_rows)
            continue
        if o.out_rate <= 0 or o.running <= 0:
            continue
        task_s = o.running / o.out_rate * old_rows  # per read row's worth of this operator's output
        total += task_s * new_rows / old_rows if new_rows > old_rows else task_s
    return total


class Drain:
    """After a change of block size the blocks already in the pipeline come out first, for as long
    as they take (seconds with small blocks, tens of seconds with 8,000-row blocks queued), and the
    first new block then takes the pipeline's latency at its size to reach the sink: a measurement
    of the new size starts once the sink has delivered as many samples as the pipeline held at the
    change and that latency has passed, no sooner than ``settle_s`` (nor later than ``max_s``).

    ``overlapped``: the latency counts from the change, alongside the drain (the first new block is
    read at once and travels while the old ones come out), instead of after it. The block sizer
    overlaps them: stacked, a 16x probe waited out the 30 s bound live before its first measurement.
    The oracle stacks them: it pays seconds, never a measurement that starts early."""

    def __init__(self, settle_s: float, max_s: float = 30.0, overlapped: bool = False):
        self.settle_s, self.max_s, self.overlapped = settle_s, max_s, overlapped
        self.t0: float | None = None
        self.left = 0.0
        self.last_t = 0.0
        self.done_t: float | None = None
        self.drained_t: float | None = None
        self.fill_s = 0.0
        self.middle_rows: float | None = None
        self.growing = False

    def start(self, obs: Observation, old_rows: int, new_rows: int | None = None,
              fits: dict[str, tuple[float, float]] | None = None) -> None:
        self.t0, self.last_t, self.done_t, self.drained_t = obs.t, obs.t, None, None
        self.left = held_samples(obs, old_rows)
        self.fill_s = fill_seconds(obs, old_rows, new_rows, fits) if new_rows else 0.0
        # Where the sink's blocks are counted (live), the new size shows there directly: its rows per
        # block past the geometric middle of the old and the new size. The held-samples count above
        # overstated the queues live (8,000-row blocks arrived 17 s before it ran out).
        per_block = obs.extra.get("sink_rows_per_block")
        self.middle_rows = (per_block * math.sqrt(new_rows / old_rows)
                            if per_block and new_rows and new_rows != old_rows else None)
        self.growing = bool(new_rows and new_rows > old_rows)

    @property
    def draining(self) -> bool:
        return self.t0 is not None and self.done_t is None

    def update(self, obs: Observation) -> bool:
        """Count this interval's deliveries; True once drained (always, before any change)."""
        if not self.draining:
            return True
        self.left -= obs.throughput * max(obs.t - self.last_t, 0.0)
        self.last_t = obs.t
        since = obs.t - self.t0
        per_block = obs.extra.get("sink_rows_per_block")
        arrived = self.middle_rows is not None and per_block is not None and (
            per_block >= self.middle_rows if self.growing else per_block <= self.middle_rows)
        if (self.left <= 0 or arrived) and self.drained_t is None:
            self.drained_t = obs.t
        # the new size seen at the sink is the fill done, where overlapped (the oracle still waits it out)
        filled = (self.overlapped and arrived) or \
            (since if self.overlapped else obs.t - (self.drained_t or obs.t)) >= self.fill_s
        if (self.drained_t is not None and since >= self.settle_s and filled) or since >= self.max_s:
            self.done_t = obs.t
        return self.done_t is not None


class BlockSizer:
    """Steers ``BlockRowsSpec`` rows per block (see the module docstring). Plain Python: runs
    live inside the executor's controller and in the simulator alike."""

    def __init__(self, spec: BlockRowsSpec, options: dict | None = None):
        opts = options or {}
        self.spec = spec
        self.rows = int(spec.initial)
        self.max_rows = int(spec.max_rows or 16 * spec.initial)
        self.settle_s = float(opts.get("block_settle_s", 4.0))     # old blocks drain out of the queues
        self.measure_s = float(opts.get("block_measure_s", 6.0))  # delivered throughput, per size
        self.min_gain = float(opts.get("block_min_gain", 0.05))
        self.undo_margin = float(opts.get("block_undo_margin", 0.05))
        self.ban_s = float(opts.get("block_ban_s", 60.0))
        self.ops: dict[str, OpTaskTimes] = {}
        self.trial: _Trial | None = None
        self.banned_from: int | None = None  # sizes >= this are not tried until banned_until
        self.banned_until = 0.0
        self.history: deque[tuple[float, float, int, tuple]] = deque(maxlen=600)
        self._last_t: float | None = None
        self.claim_t: float | None = None  # holding the allocation to measure 'before' for a step
        self.delivering_t: float | None = None  # when the pipeline first delivered (start-up is no measurement)
        self.drain = Drain(self.settle_s, overlapped=True)
        self.last_reason = "measuring"
        #: the allocation holds from the start until the first step is judged (or none is worth one):
        #: the slots the start-up's rates suggest are wrong at the size it will choose (live, rl moved read
        #: to 11 slots and the hashing to 2 at 500-row blocks, then re-tuned at 8,000 for 30 s), and the
        #: steady start-up allocation is the quietest stretch to judge a size in
        self.opening = True
        self.opening_max_s = float(opts.get("block_opening_max_s", 90.0))

    # -- state read by the controller and the policy
    @property
    def judging(self) -> bool:
        """A step is being measured (or the throughput before it, or the first step is yet to be
        judged): the allocation holds meanwhile."""
        return self.trial is not None or self.claim_t is not None or self.opening

    def describe(self) -> str:
        return f"blocks of {self.rows:,} rows ({self.last_reason})"

    # -- measurement
    def _record(self, obs: Observation, alloc_key: tuple) -> None:
        if not self.drain.update(obs):
            return  # blocks of the old size still coming out
        self.history.append((obs.t, obs.throughput, self.rows, alloc_key))
        dt = min(obs.window_s, obs.t - self._last_t) if self._last_t is not None else obs.window_s
        self._last_t = obs.t
        if dt <= 0 or self.delivering_t is None or obs.t - self.delivering_t < self.settle_s:
            return  # the start-up's slow first tasks are not what a size costs
        for o, rows_per_task in zip(obs.ops, self.rows_per_task(obs, self.rows)):
            if o.completed:
                continue
            times = self.ops.setdefault(o.name, OpTaskTimes())
            times.add(self.rows, o.running * dt, o.out_rate * dt / rows_per_task)
            if o.rate_per_slot and o.out_rate > 0 and o.running > 0.5:
                occupied = rows_per_task * o.running / o.out_rate
                busy = rows_per_task / o.rate_per_slot  # worker-measured where Ray reports it
                extra = max(occupied - busy, 0.0)
                times.ray_fixed = extra if times.ray_fixed is None else 0.8 * times.ray_fixed + 0.2 * extra

    def delivered(self, now: float, rows: int, alloc_key: tuple, span_s: float,
                  after_t: float) -> tuple[float, float] | None:
        """``(mean, standard error)`` of the delivered samples/s of the intervals in the last ``span_s``
        at ``rows`` and this allocation, after ``after_t``: large blocks reach the sink one every
        second or two, so single intervals swing widely."""
        window = [(t, thr) for t, thr, r, key in self.history
                  if r == rows and key == alloc_key and t > after_t and t >= now - span_s]
        if len(window) < 2 or window[-1][0] - window[0][0] < 0.6 * span_s:
            return None
        pts = [thr for _, thr in window]
        mean = sum(pts) / len(pts)
        var = sum((x - mean) ** 2 for x in pts) / (len(pts) - 1)
        return mean, math.sqrt(var / len(pts))

    @staticmethod
    def rows_per_task(obs: Observation, rows: int) -> list[float]:
        """Output rows of one task of each operator with blocks of ``rows`` read: the read's block
        itself (its 'element ratio' is rows per input item, not a filter), then the later operators'
        element ratios."""
        out, cum = [], float(rows)
        for i, o in enumerate(obs.ops):
            if i > 0 and o.element_ratio > 0:
                cum *= o.element_ratio
            out.append(cum)
        return out

    # -- the model
    def predict(self, obs: Observation, rows: int) -> tuple[float, str | None, dict] | None:
        """Predicted samples/s at ``rows`` per block, the bottleneck operator there and each
        operator's fitted ``(fixed, per_row)``; None before any operator is measured."""
        factors = obs.extra.get("sink_factors") or [1.0] * len(obs.ops)
        caps: dict[str, float] = {}
        fits: dict[str, tuple[float, float]] = {}
        for o, f, out_rows in zip(obs.ops, factors, self.rows_per_task(obs, rows)):
            if o.completed:
                continue
            fit = self.ops.get(o.name, OpTaskTimes()).fit()
            if fit is None:
                continue  # no task of it finished yet
            fixed, per_row = fit
            task_s = fixed + per_row * rows
            if task_s <= 0:
                continue
            fits[o.name] = fit
            caps[o.name] = o.slots * out_rows / task_s * f
        if not caps:
            return None
        bottleneck = min(caps, key=caps.get)
        return caps[bottleneck], bottleneck, fits

    def _mem_cap(self, obs: Observation) -> int:
        """The largest block size whose working set fits the object store: every slot's task holds
        an input and an output block, and together they may take ``WORKING_SET_SHARE`` of the limit
        (the queues between operators are bounded in bytes by Ray's backpressure, not in blocks)."""
        if not math.isfinite(obs.mem_limit) or obs.mem_limit <= 0:
            return self.max_rows
        queued = obs.ops[1:]  # the read's input queue holds what is still to be read, no rows
        blocks = sum(o.queue_blocks for o in queued)
        if blocks >= 1:
            bytes_per_row = sum(o.queue_bytes for o in queued) / blocks / self.rows
        elif obs.mem_used > 0:  # nothing queued: all of it is the tasks' own blocks
            bytes_per_row = obs.mem_used / max(sum(o.running for o in obs.ops), 1.0) / 2 / self.rows
        else:
            return self.rows  # nothing measured yet: no larger block
        slots = sum(o.slots for o in obs.ops)
        if bytes_per_row <= 0 or slots <= 0:
            return self.max_rows
        return max(int(WORKING_SET_SHARE * obs.mem_limit / (2 * slots * bytes_per_row)), self.spec.min_rows)

    # -- the decision
    def decide(self, obs: Observation, alloc: dict[str, int]) -> tuple[int, dict] | None:
        """``(new rows per block, explanation)`` or None (hold)."""
        now = obs.t
        if self.delivering_t is None and obs.throughput > 0:
            self.delivering_t = now
        key = tuple(sorted(alloc.items()))
        self._record(obs, key)
        if self.opening and self.delivering_t is not None and now - self.delivering_t > self.opening_max_s:
            self.opening = False  # never measured enough to step: the allocation policy may not wait longer
        if self.trial is not None:
            return self._judge(obs, key)
        fits = self._mem_cap(obs)
        if fits < self.rows and self.rows > self.spec.initial:
            new = max(self.rows // 2, self.spec.initial, self.spec.min_rows)
            self.claim_t = None
            return self._step(obs, new, None, why=(
                f"the tasks' blocks would take over {WORKING_SET_SHARE:.0%} of the object store's limit "
                f"(blocks of at most {fits:,} rows fit): blocks of {new:,} rows"))
        # the pipeline's start-up is not a measurement (workers start; a stall of seconds), nor are
        # the old blocks draining after a change
        if self.delivering_t is None or now - self.delivering_t < self.measure_s + self.settle_s:
            self.last_reason = "waiting for the pipeline to deliver steadily" + (
                "; the allocation holds until the first block size is judged" if self.opening else "")
            return None
        if self.drain.draining or obs.extra.get("throughput_long", obs.throughput) <= 0:
            self.last_reason = "the blocks of the old size draining" if self.drain.draining else "nothing delivered"
            return None
        plan = self._plan(obs, fits, now)
        if plan is None:
            self.claim_t = None
            if self.predict(obs, self.rows) is not None:  # measured, and no step worth it
                self.opening = False
            return None
        new, gain, why = plan
        # the delivered throughput at this size and allocation, settled: claimed (the allocation holds)
        # when the allocation policy has not left a quiet stretch to measure it in
        settled = max(now - obs.since_change_s + self.settle_s,
                      self.drain.done_t if self.drain.done_t is not None else -math.inf)
        got = self.delivered(obs.t, self.rows, key, self.measure_s, settled)
        before = got[0] if got is not None else None
        if before is None or before <= 0:
            if self.claim_t is None:
                self.claim_t = now
                self.last_reason = "holding the allocation to measure the throughput before a block-size step"
            elif now - self.claim_t > 3 * (self.measure_s + self.settle_s):  # never steady: let go
                self.claim_t = None
                self.opening = False
            return None
        self.claim_t = None
        return self._step(obs, new, gain, why=why, before=before)

    def _plan(self, obs: Observation, fits: int, now: float) -> tuple[int, float | None, str] | None:
        """The next size worth a step: ``(rows, expected gain, why)``; None: stay."""
        cap = min(self.max_rows, fits)
        banned = self.banned_from is not None and now < self.banned_until
        if banned:
            cap = min(cap, self.banned_from - 1)
        larger = doubled_sizes(self.rows, cap)[1:5]  # 2x, 4x, 8x, 16x that fit
        # 2x-8x; after an undone step every size up to it, to interpolate between the measured ones
        cands = larger if banned else larger[:3]
        if not cands:
            self.last_reason = "the largest size the object store and the measurements allow"
            return None
        here = self.predict(obs, self.rows)
        if here is None:
            self.last_reason = "no operator's task times measured yet"
            return None
        t_here, bottleneck, fits_ = here
        fixed = fits_.get(bottleneck, (0.0, 0.0))[0] if bottleneck else 0.0
        best = None
        for r in cands:
            p = self.predict(obs, r)
            if p is not None and (best is None or p[0] > best[1]):
                best = (r, p[0])
        gain = best[1] / t_here - 1.0 if best is not None and t_here > 0 else None
        sizes = len(self.ops.get(bottleneck, OpTaskTimes()).means()) if bottleneck else 0
        if sizes < 2:
            # A fixed cost inside the task shows only across sizes: probe the largest size allowed (up
            # to 16x), then either keep it or, undone, interpolate between the two measured sizes.
            # One step instead of a climb: each measured step costs ~20-30 s live (drain, fill, noise).
            new = larger[-1]
            g = f"{gain:+.0%} from Ray's share alone" if gain is not None else "unknown"
            return new, gain, (
                f"bottleneck {bottleneck} ({t_here:,.0f} samples/s at {self.rows:,} rows per block; fixed cost "
                f"per task outside the task {fixed:.3f} s): probing blocks of {new:,} rows (expected gain {g}), "
                "undone if it delivers less")
        if best is None or gain is None or gain < self.min_gain:
            self.last_reason = (f"converged: bottleneck {bottleneck}, {fixed:.3f} s fixed per task, larger blocks "
                                f"predict {gain:+.0%}" if gain is not None else "converged")
            return None
        return best[0], gain, (
            f"bottleneck {bottleneck}: {fixed:.3f} s fixed per task at {self.rows:,} rows per block; blocks of "
            f"{best[0]:,} rows: expected {best[1]:,.0f} samples/s ({gain:+.0%})")

    def _step(self, obs: Observation, new: int, gain: float | None, *, why: str,
              before: float | None = None) -> tuple[int, dict]:
        """Change to ``new`` rows; ``before``: the throughput to judge it against (None: not judged)."""
        old = self.rows
        pred = self.predict(obs, old)  # the bottleneck under the block-size model, else the observation's
        if before is not None:
            self.trial = _Trial(obs.t, old, new, before)
        self.rows = new
        fits = {n: f for n, times in self.ops.items() if (f := times.fit()) is not None}
        self.drain.start(obs, old, new, fits)
        self.last_reason = why
        return new, {"bottleneck": pred[1] if pred is not None else obs.bottleneck(), "expected_gain": gain,
                     "text": why, "block_rows": [old, new]}

    def _judge(self, obs: Observation, key: tuple) -> tuple[int, dict] | None:
        tr = self.trial
        assert tr is not None
        start = self.drain.done_t or tr.t
        if self.drain.draining or obs.t - start < self.measure_s:
            return None
        # every interval since the drain, up to three windows: one window decides where it is clear
        got = self.delivered(obs.t, self.rows, key, min(obs.t - start, 3 * self.measure_s), start)
        if got is None:
            if obs.t - tr.t > self.drain.max_s + 4 * self.measure_s:  # never measured steady: give up, keep it
                self.trial = None
                self.opening = False
            return None
        after, se = got
        # undone only when clearly less: beyond the margin and twice the measurement's own error
        undo = after + 2 * se < tr.before * (1.0 - self.undo_margin)
        clear = undo or after - 2 * se > tr.before * (1.0 - self.undo_margin)
        # noisy (a few large blocks per window): measure longer, up to three windows, unless the
        # answer is already clear (live: 6,900 against 2,000 after the first window, kept 28 s later)
        if se > 0.1 * after and not clear and obs.t - start < 3 * self.measure_s:
            return None
        self.trial = None
        self.opening = False
        if undo:
            self.banned_from = tr.after_rows
            self.banned_until = obs.t + self.ban_s
            return self._step(obs, tr.before_rows, after / tr.before - 1.0, why=(
                f"blocks of {tr.after_rows:,} rows delivered {after:,.0f} samples/s against {tr.before:,.0f} at "
                f"{tr.before_rows:,}: undone"))
        self.last_reason = (f"blocks of {tr.after_rows:,} rows kept: {after:,.0f} samples/s against {tr.before:,.0f} "
                            f"at {tr.before_rows:,}")
        return None

    def forget(self) -> None:
        """A new execution: the step in flight is void (its 'before' was another execution's)."""
        self.trial = None
        self.claim_t = None
        self.history.clear()
        self._last_t = None
        self.delivering_t = None
        self.drain = Drain(self.settle_s, overlapped=True)
