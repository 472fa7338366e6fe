"""A pipeline simulator: a gymnasium env for pretraining the RL tuner offline.

The model is a chain of operators between bounded-by-memory queues, stepped as
a fluid with a few sub-steps per second:

* operator i with n_i slots (each ``num_cpus`` CPUs) outputs up to
  ``n_eff(n_i) * mu_i`` of its own rows per second, where ``mu_i`` is the rate
  of one slot and ``n_eff`` saturates at ``sat_i`` slots when the operator is
  limited by something other than its CPUs (a storage service with a fixed
  number of channels, say): slots past the knee wait, busy but useless;
* a contended operator (``contention``) slows down by the tasks it *runs*: starved, it
  runs fewer than its slots, each faster, as a live lock-bound operator does;
* it consumes ``1/ratio_i`` input rows per output row (filters, dedup, packing);
* new slots start after ``lag_i`` seconds (actor start-up);
* the trainers take at most ``consumer_rate`` samples/s;
* object-store memory is the bytes queued between operators; at the limit the
  tuner's memory guard stops the operators that hold the most.

It emits the same cumulative counters as the live hooks (``RawSnapshot``), so
the controller's observation, features, masks and action semantics are shared
code, not re-implementations. Costs come from a profiling pass of a real
pipeline (:func:`from_profile`) or are drawn at random (:func:`random_pipeline`)
so that the policy generalises across pipelines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dlrm_platform.tuner.actions import K_MAX, N_ACTIONS, grow_while_it_pays, project
from dlrm_platform.tuner.features import OBS_DIM, FeatureState, featurize
from dlrm_platform.tuner.observe import RawOp, RawSnapshot, WindowedObserver, sink_factors
from dlrm_platform.tuner.spec import Allocation, OpSpec


@dataclass
class SimOp:
    name: str
    mu: float                 # own output rows/s of one slot
    num_cpus: float = 1.0
    ratio: float = 1.0        # output rows per input row
    sat: float | None = None  # effective slots saturate here (None: linear)
    lag: float = 0.0          # seconds before an added slot works
    contention: float = 0.0   # USL coherency cost: n slots do n / (1 + contention * n * (n - 1)) slots' work
    task_s: float = 0.0       # fixed seconds of each task whatever its rows (dispatch, a storage request)

    def rate(self, rows_out_per_task: float) -> float:
        """Output rows/s of one occupied slot with tasks of ``rows_out_per_task`` rows: ``mu`` less the
        fixed cost per task (``mu`` itself with none)."""
        if self.task_s <= 0 or rows_out_per_task <= 0:
            return self.mu
        return rows_out_per_task / (self.task_s + rows_out_per_task / self.mu)

    def n_eff(self, n: float) -> float:
        if n <= 0:
            return 0.0
        eff = n
        if self.sat is not None:  # smooth min(n, sat)
            p = 6.0
            eff = n / (1.0 + (n / self.sat) ** p) ** (1.0 / p)
        if self.contention:  # past the peak, more slots deliver less (lock or cache contention)
            eff /= 1.0 + self.contention * n * (n - 1.0)
        return eff

    def tasks_running(self, n: float, out_rate: float, mu: float | None = None) -> float:
        """How many of its ``n`` slots run a task while it outputs ``out_rate`` rows/s.

        A contended operator's tasks slow each other down by how many *run*, not by how many
        slots it holds (live: callers queue on the table's lock). Starved, it runs the fewest
        tasks that deliver its input (the smallest ``b`` with ``n_eff(b) * mu = out_rate``), each
        at that lower contention, so its rate per occupied slot is higher than at ``n`` busy
        slots, as a live run measures it. Otherwise its slots are busy in proportion."""
        mu = self.mu if mu is None else mu
        cap = self.n_eff(n) * mu
        if cap <= 0 or out_rate <= 0:
            return 0.0
        if not self.contention or out_rate >= cap * (1 - 1e-9):
            return n * min(out_rate / cap, 1.0)
        lo, hi = 0.0, min(n, 1.0 / math.sqrt(self.contention))  # n_eff rises up to its peak
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.n_eff(mid) * mu < out_rate else (lo, mid)
        return hi


@dataclass
class SimPipeline:
    ops: list[SimOp]
    budget: float
    block_rows: float = 1000.0
    row_bytes: float = 500.0
    consumer_rate: float = math.inf     # samples/s the trainers can take
    mem_limit: float = 2e9              # bytes
    noise: float = 0.06                 # multiplicative measurement noise (std of log)
    # more noise on the operators' own counters only (std of log, per step), not on the delivered
    # throughput: live, an operator whose tasks outlast the interval sees 0-3 of them finish per second
    op_noise: float = 0.0
    lumpy: bool = False                 # outputs become visible a block at a time (as live)
    # each running task holds its input and output block in the object store (memory grows with
    # block size); off for the training mix, whose memory model is the queues alone
    inflight_memory: bool = False

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.ops]

    def specs(self, initial: Allocation | None = None) -> list[OpSpec]:
        return [OpSpec(o.name, o.num_cpus, initial=(initial or {}).get(o.name, 1)) for o in self.ops]

    @property
    def samples_per_sink_row(self) -> float:
        """A last operator that packs rows into batches (ratio < 0.1) delivers 1/ratio samples per row."""
        last = self.ops[-1].ratio
        return 1.0 / last if last < 0.1 else 1.0

    def factors(self) -> list[float]:
        return sink_factors([o.ratio for o in self.ops], self.samples_per_sink_row)

    def rows_per_task(self) -> list[float]:
        """Output rows of one task of each operator at ``block_rows`` per block read (the read's
        task outputs the block; the later operators' ratios filter it)."""
        out, cum = [], float(self.block_rows)
        for i, o in enumerate(self.ops):
            if i > 0:
                cum *= o.ratio
            out.append(cum)
        return out

    def rates(self) -> list[float]:
        """Output rows/s of one slot of each operator at the current block size."""
        return [o.rate(r) for o, r in zip(self.ops, self.rows_per_task())]

    def capacities(self, alloc: Allocation) -> dict[str, float]:
        """Samples/s each operator sustains at ``alloc``."""
        return {o.name: o.n_eff(alloc[o.name]) * mu * f for o, mu, f in zip(self.ops, self.rates(), self.factors())}

    def optimum_over_block_rows(self, sizes: Sequence[float]) -> tuple[Allocation, float, float]:
        """The best ``(allocation, block rows, rows/s)`` over ``sizes`` (memory not modelled here)."""
        keep = self.block_rows
        best = None
        try:
            for b in sizes:
                self.block_rows = float(b)
                alloc, t = self.optimum()
                if best is None or t > best[2]:
                    best = (alloc, float(b), t)
        finally:
            self.block_rows = keep
        assert best is not None
        return best

    def throughput(self, alloc: Allocation) -> float:
        return min(min(self.capacities(alloc).values()), self.consumer_rate)

    def optimum(self) -> tuple[Allocation, float]:
        """Best whole-slot allocation: grow the bottleneck while it helps (exact for
        concave capacities with one CPU size; near-exact otherwise)."""
        specs = self.specs()
        alloc = {s.name: s.min_slots for s in specs}
        used = sum(alloc[s.name] * s.num_cpus for s in specs)
        while True:
            caps = self.capacities(alloc)
            order = sorted(specs, key=lambda s: caps[s.name])
            grown = False
            for s in order[:1]:
                if used + s.num_cpus <= self.budget + 1e-9:
                    trial = dict(alloc)
                    trial[s.name] += 1
                    if self.capacities(trial)[s.name] > caps[s.name] * 1.001:
                        alloc, used, grown = trial, used + s.num_cpus, True
            if not grown:
                break
        # spend the leftover on whatever is cheapest and lowest (does not change the min)
        return alloc, self.throughput(alloc)


class PipelineSim:
    """Fluid dynamics of a ``SimPipeline`` under a changing allocation."""

    SUBSTEPS = 4

    def __init__(self, pipe: SimPipeline, rng: np.random.Generator):
        self.pipe = pipe
        self.rng = rng
        k = len(pipe.ops)
        self.t = 0.0
        self.q = np.zeros(k + 1)          # q[i]: rows waiting before op i (q[0] unused); q[k]: sink buffer
        self.raw = {o.name: RawOp() for o in pipe.ops}
        self.sink_rows = 0.0
        self.active = {o.name: 0.0 for o in pipe.ops}
        self.pending: list[tuple[float, str, int]] = []
        self.target: Allocation = {o.name: 0 for o in pipe.ops}

    def set_allocation(self, alloc: Allocation) -> None:
        for o in self.pipe.ops:
            new, old = alloc[o.name], self.target.get(o.name, 0)
            if new > old and o.lag > 0:
                self.pending.append((self.t + o.lag, o.name, new - old))
            elif new > old:
                self.active[o.name] += new - old
            elif new < old:
                drop = old - new
                # cancel pending starts first, then running slots
                keep = []
                for when, name, cnt in self.pending:
                    if name == o.name and drop > 0:
                        c = min(cnt, drop)
                        drop -= c
                        cnt -= c
                    if cnt > 0:
                        keep.append((when, name, cnt))
                self.pending = keep
                self.active[o.name] = max(self.active[o.name] - drop, 0.0)
        self.target = dict(alloc)

    def mem_used(self) -> float:
        used = float(self.q[1:].sum()) * self.pipe.row_bytes
        if self.pipe.inflight_memory:  # a running task holds its input and output block
            rows = self.pipe.rows_per_task()
            for i, o in enumerate(self.pipe.ops):
                held = rows[i] + (rows[i - 1] if i > 0 else 0.0)
                used += self.active[o.name] * held * self.pipe.row_bytes
        return used

    def step(self, dt: float = 1.0) -> RawSnapshot:
        p = self.pipe
        k = len(p.ops)
        h = dt / self.SUBSTEPS
        rates = p.rates()
        for _ in range(self.SUBSTEPS):
            self.t += h
            ready = [x for x in self.pending if x[0] <= self.t]
            self.pending = [x for x in self.pending if x[0] > self.t]
            for _, name, cnt in ready:
                self.active[name] += cnt
            over = self.mem_used() >= p.mem_limit
            share = p.mem_limit / (k + 1) / p.row_bytes
            # consumer first (downstream frees space first)
            take = min(self.q[k], p.consumer_rate / p.factors()[-1] * h if math.isfinite(p.consumer_rate) else self.q[k])
            self.q[k] -= take
            self.sink_rows += take
            for i in range(k - 1, -1, -1):
                o = p.ops[i]
                r = self.raw[o.name]
                n = self.active[o.name]
                cap_out = o.n_eff(n) * rates[i] * h
                if i == 0:
                    want_in = math.inf
                    out = cap_out
                else:
                    want_in = self.q[i]
                    out = min(cap_out, self.q[i] * o.ratio)
                blocked = over and self.q[i + 1] >= share
                if blocked:
                    out = 0.0
                else:
                    # no output past the memory limit (what it consumes frees memory)
                    room = max(p.mem_limit - self.mem_used(), 0.0) / p.row_bytes
                    if i > 0:
                        room += min(out / o.ratio, self.q[i])
                    out = min(out, room)
                    blocked = out <= 0.0
                consumed = out / o.ratio if i > 0 else out / o.ratio
                if i > 0:
                    self.q[i] -= consumed
                self.q[i + 1] += out
                busy = (out / cap_out) if cap_out > 0 else 0.0
                r.rows_in += consumed
                r.rows_out += out
                if h > 0:  # step(0.0) only reads the counters
                    r.slot_seconds += o.tasks_running(n, out / h, rates[i]) * h
                if (want_in > 0 and busy > 0.98) or blocked:
                    r.bp_seconds += h
        snap_ops = {}
        for i, o in enumerate(p.ops):
            r = self.raw[o.name]
            r.running = self.active[o.name]
            r.queue_blocks = (self.q[i] / p.block_rows) if i > 0 else 0.0
            r.queue_bytes = (self.q[i] * p.row_bytes) if i > 0 else 0.0
            noisy = replace(r)
            snap_ops[o.name] = noisy
        return RawSnapshot(
            t=self.t,
            ops=snap_ops,
            sink_rows=self.sink_rows,
            mem_used=self.mem_used(),
            mem_limit=p.mem_limit,
            data_wait=None,
        )


class NoisyCounters:
    """Adds mean-preserving multiplicative noise to counter increments, as block
    granularity and scheduling jitter do to live measurements."""

    #: noise of the workers' own time per row (live, per_task_overhead's sleep-timed operators: within 1-3%)
    BUSY_SIGMA = 0.03

    def __init__(self, sigma: float, rng: np.random.Generator, block_rows: float = 0.0, op_sigma: float = 0.0):
        self.sigma = sigma
        self.op_sigma = math.hypot(sigma, op_sigma)  # the operators' counters: both noises
        self.rng = rng
        # its own stream: the counters' noise stays what it was for a given seed
        self.busy_rng = np.random.default_rng(int(rng.bit_generator.state["state"]["state"] % 2**32)
                                              if "state" in rng.bit_generator.state else 0)
        self.block_rows = block_rows  # >0: outputs become visible a whole block at a time
        self.prev_true: RawSnapshot | None = None
        self.acc: dict[str, list[float]] = {}
        self.sink = 0.0

    def __call__(self, snap: RawSnapshot) -> RawSnapshot:
        if self.prev_true is None:
            self.prev_true = snap
            self.acc = {n: [o.rows_out, o.slot_seconds, o.slot_seconds] for n, o in snap.ops.items()}
            self.cost = {}
            self.sink = snap.sink_rows
            return snap
        def z(sigma: float = self.sigma) -> float:
            return float(np.exp(self.rng.normal(0.0, sigma) - sigma**2 / 2))
        ops = {}
        for n, o in snap.ops.items():
            po = self.prev_true.ops[n]
            d_rows = (o.rows_out - po.rows_out) * z(self.op_sigma)
            self.acc[n][0] += d_rows
            self.acc[n][1] += (o.slot_seconds - po.slot_seconds) * z()
            # the workers time each block they make: the busy time reported with the rows is their true cost
            # per row (slot time per row produced, with any contention) within a few percent, however the
            # rows themselves arrive
            if o.rows_out > po.rows_out:
                self.cost[n] = (o.slot_seconds - po.slot_seconds) / (o.rows_out - po.rows_out)
            self.acc[n][2] += d_rows * self.cost.get(n, 0.0) * float(
                np.exp(self.busy_rng.normal(0.0, self.BUSY_SIGMA) - self.BUSY_SIGMA**2 / 2))
            rows, busy = self.acc[n][0], self.acc[n][2]
            if self.block_rows > 0 and rows > 0:
                # tasks report when a block is done: rows and their busy time arrive in lumps
                seen = math.floor(rows / self.block_rows) * self.block_rows
                busy, rows = busy * seen / rows, seen
            ops[n] = replace(o, rows_out=rows, slot_seconds=self.acc[n][1], busy_seconds=busy)
        self.sink += (snap.sink_rows - self.prev_true.sink_rows) * z()
        sink = self.sink
        if self.block_rows > 0:
            sink = math.floor(sink / self.block_rows) * self.block_rows
        self.prev_true = snap
        return replace(snap, ops=ops, sink_rows=sink)


# --------------------------------------------------------------------------- pipelines

OP_NAMES = ("read", "parse", "dense", "hash", "truncate", "cross", "dedup", "batch")


@dataclass(frozen=True)
class PipelineMix:
    """The distribution :func:`random_pipeline` draws simulated pipelines from."""

    min_ops: int = 3                 # operators per pipeline: min_ops..K_MAX
    cost_span: float = 50.0          # the dearest operator's cost per block over the cheapest's, at most
    p_storage_read: float = 0.3      # the read sits behind 2-6 storage channels (saturates there)
    p_saturating: float = 0.15       # any other operator saturates at 2-10 slots
    p_filter: float = 0.15           # an operator keeps 50-95% of its input rows
    p_expand: float = 0.1            # an operator emits 1.5-4 rows per input row


#: ``v1``: what the shipped policy was first trained and evaluated on (2-8 operators, ~30x costs,
#: no storage-bound read, no expanding operator); ``issue11``: the issue's distribution, the default.
PIPELINE_MIXES: dict[str, PipelineMix] = {
    "v1": PipelineMix(min_ops=2, cost_span=30.0, p_storage_read=0.0, p_expand=0.0),
    "issue11": PipelineMix(),
}
DEFAULT_MIX = "issue11"


def random_pipeline(rng: np.random.Generator, k: int | None = None, mix: str = DEFAULT_MIX) -> SimPipeline:
    """A random pipeline from ``PIPELINE_MIXES[mix]`` (the same ``rng`` state, the same pipeline)."""
    m = PIPELINE_MIXES[mix]
    k = int(k or rng.integers(m.min_ops, K_MAX + 1))
    cpus_choice = rng.choice([0.5, 1.0, 1.0, 1.0, 2.0], size=k) if rng.random() < 0.3 else np.ones(k)
    # per-block seconds of one slot, log-uniform over cost_span
    sec_per_block = np.exp(rng.uniform(np.log(1.5 / m.cost_span), np.log(1.5), size=k))
    block_rows = 1000.0
    ratios = np.ones(k)
    for i in range(1, k):
        if rng.random() < m.p_filter:
            ratios[i] = float(rng.uniform(0.5, 0.95))
        elif m.p_expand and rng.random() < m.p_expand:
            ratios[i] = float(rng.uniform(1.5, 4.0))
    if rng.random() < 0.3:
        ratios[-1] = 1.0 / float(rng.choice([256, 512, 1024]))  # packs samples into batches
    ops = []
    for i in range(k):
        mu = block_rows * ratios[i] / sec_per_block[i]
        if i == 0 and m.p_storage_read and rng.random() < m.p_storage_read:
            sat: float | None = float(rng.uniform(2, 6))
        else:
            sat = float(rng.uniform(2, 10)) if rng.random() < m.p_saturating else None
        lag = float(rng.choice([0.0, 0.0, 1.0, 2.0]))
        ops.append(SimOp(OP_NAMES[i] if i < len(OP_NAMES) else f"op{i}", mu, float(cpus_choice[i]),
                         float(ratios[i]), sat, lag))
    min_need = sum(o.num_cpus for o in ops)
    budget = float(np.round(rng.uniform(min_need + 2, max(min_need + 4, 48.0))))
    pipe = SimPipeline(ops=ops, budget=budget, block_rows=block_rows,
                       row_bytes=float(rng.uniform(100, 2000)),
                       noise=float(rng.uniform(0.03, 0.12)))
    pipe.mem_limit = float(pipe.row_bytes * block_rows * rng.uniform(20, 400))
    if rng.random() < 0.6:
        pipe.lumpy = True
        _, t_opt = pipe.optimum()
        # 2 to 40 blocks per second through the pipeline at its optimum
        pipe.block_rows = float(max(1.0, t_opt / pipe.samples_per_sink_row / rng.uniform(2, 40)))
    if rng.random() < 0.15:
        _, t_opt = pipe.optimum()
        pipe.consumer_rate = t_opt * float(rng.uniform(0.3, 0.9))
    return pipe


def from_profile(profile: dict, rng: np.random.Generator | None = None, jitter: float = 0.0) -> SimPipeline:
    """A simulated pipeline from a profiling pass (``profile.ProfileResult.to_dict()``),
    optionally with each operator's cost jittered by up to ``jitter`` (log-scale)."""
    ops = []
    for o in profile["ops"]:
        mu = float(o["rate_per_slot"])
        if rng is not None and jitter > 0:
            mu *= float(np.exp(rng.uniform(-jitter, jitter)))
        ops.append(SimOp(o["name"], mu, float(o.get("num_cpus", 1.0)), float(o.get("element_ratio", 1.0)),
                         o.get("sat"), float(o.get("lag", 0.0)), float(o.get("contention") or 0.0),
                         float(o.get("task_s") or 0.0)))
    return SimPipeline(
        ops=ops,
        budget=float(profile["cpu_budget"]),
        block_rows=float(profile.get("block_rows", 1000.0)),
        row_bytes=float(profile.get("row_bytes", 500.0)),
        mem_limit=float(profile.get("mem_limit", 2e9)),
        noise=float(profile.get("noise", 0.06)),
        lumpy=bool(profile.get("lumpy", True)),
        inflight_memory=bool(profile.get("inflight_memory", False)),
    )


def initial_allocation(pipe: SimPipeline, rng: np.random.Generator, mode: str | None = None) -> Allocation:
    specs = pipe.specs()
    mode = mode or str(rng.choice(["even", "min", "random"], p=[0.45, 0.25, 0.30]))
    if mode == "min":
        return {s.name: 1 for s in specs}
    if mode == "even":
        per = pipe.budget / sum(s.num_cpus for s in specs)
        return project({s.name: max(1, int(per)) for s in specs}, specs, pipe.budget)
    w = rng.dirichlet(np.ones(len(specs)))
    return project({s.name: max(1, int(w[i] * pipe.budget / s.num_cpus)) for i, s in enumerate(specs)},
                   specs, pipe.budget)


# --------------------------------------------------------------------------- gym env


@dataclass
class EnvConfig:
    episode_steps: int = 80
    interval_s: float = 1.0
    window_s: float = 3.0
    settle_s: float = 1.0
    shift_prob: float = 0.5
    profile: dict | None = None
    profile_prob: float = 0.5      # share of episodes built from `profile` when one is given
    profile_jitter: float = 0.4
    mem_penalty: float = 2.0
    spill_penalty: float = 1.0
    move_cost: float = 0.003
    seed: int | None = None
    mix: str = DEFAULT_MIX         # random pipelines: simulator.PIPELINE_MIXES
    # Slots a "+1" gives, at most (actions.grow_while_it_pays; live: RLPolicyRunner.max_repeat = 4).
    # Training with one: the net learns which operator to grow, the measured rates decide how far
    # (trained with 4, the same recipe scored 0.952 of the optimum on held-out pipelines, against 0.973).
    move_slots: int = 1
    extra: dict = field(default_factory=dict)


def make_env_class():
    """The gymnasium Env class (built lazily so importing this module needs no gymnasium)."""
    import gymnasium as gym

    class PipelineTunerEnv(gym.Env):
        """Observation: ``features.featurize`` (normalised, with the action mask);
        action: ``actions`` (hold / +1 op / -1 op); reward: delivered samples/s over
        the best achievable, minus memory-pressure, spill and churn penalties."""

        metadata = {"render_modes": []}

        def __init__(self, config: dict | EnvConfig | None = None):
            super().__init__()
            if isinstance(config, EnvConfig):
                cfg = config
            else:
                cfg = EnvConfig(**{k: v for k, v in dict(config or {}).items()
                                   if k in EnvConfig.__dataclass_fields__})
            self.cfg = cfg
            self.observation_space = gym.spaces.Box(-2.0, 2.0, (OBS_DIM,), np.float32)
            self.action_space = gym.spaces.Discrete(N_ACTIONS)
            self.rng = np.random.default_rng(cfg.seed)
            self.pipe: SimPipeline | None = None

        # -- helpers
        def _new_pipeline(self) -> SimPipeline:
            if self.cfg.profile is not None and self.rng.random() < self.cfg.profile_prob:
                return from_profile(self.cfg.profile, self.rng, self.cfg.profile_jitter)
            return random_pipeline(self.rng, mix=self.cfg.mix)

        def _observe(self):
            obs = self.observer.observation(self.alloc, self.cpus, self.pipe.budget,
                                            samples_per_sink_row=self.pipe.samples_per_sink_row)
            self.last_obs = obs
            vec, mask = featurize(obs, self.alloc, self.specs, self.pipe.budget, self.fs)
            self.mask = mask
            return vec

        def _advance(self):
            snap = self.noise(self.sim.step(self.cfg.interval_s))
            self.observer.push(snap)

        def reset(self, *, seed=None, options=None):
            if seed is not None:
                self.rng = np.random.default_rng(seed)
            options = options or {}
            self.pipe = options.get("pipeline") or self._new_pipeline()
            self.specs = self.pipe.specs()
            self.cpus = {s.name: s.num_cpus for s in self.specs}
            self.alloc = options.get("allocation") or initial_allocation(self.pipe, self.rng)
            self.sim = PipelineSim(self.pipe, self.rng)
            self.sim.set_allocation(self.alloc)
            self.noise = NoisyCounters(self.pipe.noise, self.rng, self.pipe.block_rows if self.pipe.lumpy else 0.0,
                                       self.pipe.op_noise)
            self.observer = WindowedObserver(self.cfg.window_s, self.cfg.settle_s)
            self.fs = FeatureState(self.pipe.names)
            self.steps = 0
            self.opt_alloc, self.t_opt = self.pipe.optimum()
            self.shift_at = (int(self.rng.integers(self.cfg.episode_steps // 3, 2 * self.cfg.episode_steps // 3))
                             if self.rng.random() < self.cfg.shift_prob else None)
            self.sim.step(0.0)
            self.observer.push(self.noise(RawSnapshot(0.0, {n: RawOp() for n in self.pipe.names}, 0.0,
                                                      0.0, self.pipe.mem_limit)))
            self._advance()
            return self._observe(), {}

        def _shift(self):
            i = int(self.rng.integers(len(self.pipe.ops)))
            factor = float(self.rng.choice([0.5, 0.5, 2.0]))  # cost x2 (rate /2) more often
            op = self.pipe.ops[i]
            op.mu *= factor
            self.opt_alloc, self.t_opt = self.pipe.optimum()

        def step(self, action):
            a = int(action)
            caps = {o.name: o.capacity for o in self.last_obs.ops}
            before = dict(self.alloc)
            if not self.mask[a]:
                a = 0
            self.alloc = grow_while_it_pays(a, self.alloc, self.specs, self.pipe.budget, caps,
                                            max_slots=self.cfg.move_slots,
                                            memory_bound=self.last_obs.at_memory_limit)
            self.fs.tick()
            self.fs.note_action(before, self.alloc)
            if self.alloc != before:
                self.sim.set_allocation(self.alloc)
                self.observer.note_change(self.sim.t, [n for n in self.alloc if self.alloc[n] != before.get(n)])
            if self.shift_at is not None and self.steps == self.shift_at:
                self._shift()
            self._advance()
            self.steps += 1
            true_thr = self.pipe.throughput(self.sim.active | {})  # capacity-limited rate of active slots
            obs_vec = self._observe()
            mem_frac = self.last_obs.mem_fraction
            reward = min(true_thr / max(self.t_opt, 1e-9), 1.0)
            reward -= self.cfg.mem_penalty * max(0.0, mem_frac - 0.9)
            reward -= self.cfg.spill_penalty * (1.0 if self.last_obs.spill_rate > 0 else 0.0)
            if self.alloc != before:
                reward -= self.cfg.move_cost
            truncated = self.steps >= self.cfg.episode_steps
            return obs_vec, float(reward), False, truncated, {"throughput": true_thr, "t_opt": self.t_opt}

    return PipelineTunerEnv


def run_policy_in_sim(
    pipe: SimPipeline,
    act,  # callable(obs_vec, mask, env) -> action
    steps: int = 80,
    allocation: Allocation | None = None,
    seed: int = 0,
    shift_at: int | None = None,
    shift: tuple[str, float] | None = None,
) -> dict:
    """Roll a policy through a simulated pipeline; returns the throughput trace."""
    Env = make_env_class()
    env = Env(EnvConfig(episode_steps=steps, shift_prob=0.0, seed=seed))
    vec, _ = env.reset(seed=seed, options={"pipeline": pipe, "allocation": allocation})
    trace = []
    for t in range(steps):
        if shift_at is not None and t == shift_at and shift is not None:
            for o in env.pipe.ops:
                if o.name == shift[0]:
                    o.mu /= shift[1]
            env.opt_alloc, env.t_opt = env.pipe.optimum()
        a = act(vec, env.mask, env)
        vec, r, _, trunc, info = env.step(a)
        trace.append((info["throughput"], info["t_opt"], dict(env.alloc)))
        if trunc:
            break
    return {"trace": trace, "final_alloc": dict(env.alloc)}


def sim_specs(pipe: SimPipeline) -> Sequence[OpSpec]:
    return pipe.specs()


def run_controller_in_sim(
    pipe: SimPipeline,
    spec,
    steps: int = 120,
    shift_at: int | None = None,
    shift: tuple[str, float] | None = None,
    seed: int = 0,
    warmup: Mapping[str, tuple[float, float]] | None = None,
) -> list[dict]:
    """Drive a real ``Controller`` (any policy) against the simulator, one step per
    ``spec.interval_s``; returns per-step {t, throughput, t_opt, allocation, policy_state}.

    ``warmup``: operator -> (rate factor, seconds): its slots run at that share of their rate for the
    run's first seconds (live, workers still importing and loading tables after the first rows:
    contended_lookup's lookup ran at ~0.35 of its later rate per busy slot for ~5 s). ``t_opt`` is
    the warm pipeline's."""
    from dlrm_platform.tuner.controller import Controller

    rng = np.random.default_rng(seed)
    spec.options.setdefault("samples_per_sink_row", pipe.samples_per_sink_row)
    ctl = Controller(spec)
    sim = PipelineSim(pipe, rng)
    sim.set_allocation(ctl.allocation)
    noise = NoisyCounters(pipe.noise, rng, pipe.block_rows if pipe.lumpy else 0.0, pipe.op_noise)
    ctl.start_epoch()
    ctl.tick(noise(RawSnapshot(0.0, {n: RawOp() for n in pipe.names}, 0.0, 0.0, pipe.mem_limit)), pipe.budget)
    _, t_opt = pipe.optimum()
    warm_mu = {o.name: o.mu for o in pipe.ops}  # each operator's rate once warm (a cost shift changes it)
    out = []
    for i in range(steps):
        if shift_at is not None and shift is not None and i == shift_at:
            warm_mu[shift[0]] /= shift[1]
            for o in pipe.ops:
                o.mu = warm_mu[o.name]
            _, t_opt = pipe.optimum()
        for o in pipe.ops:
            if warmup and o.name in warmup:
                factor, seconds = warmup[o.name]
                o.mu = warm_mu[o.name] * (factor if sim.t < seconds else 1.0)
        snap = noise(sim.step(spec.interval_s))
        new = ctl.tick(snap, pipe.budget)
        if new is not None:
            sim.set_allocation(new)
        if ctl.block_rows is not None:  # the blocks read from now on (the queues keep their rows)
            pipe.block_rows = float(ctl.block_rows)
        out.append({"t": sim.t, "throughput": pipe.throughput(sim.active), "t_opt": t_opt,
                    "allocation": dict(ctl.allocation), "policy_state": ctl.policy.describe(),
                    "block_rows": ctl.block_rows})
    for o in pipe.ops:  # warm (a run shorter than a warm-up leaves no operator slowed)
        o.mu = warm_mu[o.name]
    ctl.pop_records()
    return out
