"""Synthetic session data (`dlrm-platform gen-data`): Criteo-like samples with the session structure RecD exploits.

Each session is one user shown several items. Columns (``U`` = num_user_categorical,
``Du`` = num_user_dense, ``I`` = num_item_categorical, ``Di`` = num_item_dense)::

    session_id          int64          session key; 0..num_sessions-1 in generation order
    label               int64          1 = click, 0 = no click
    u_cat_0             int64          user id, Zipf over [0, user_vocab_size) (0 = most active user)
    u_cat_1..U-1        int64          attributes of the user (segment, ...), smaller vocabularies
    u_history           list<int64>    item ids the user interacted with, length ~ U[history_length]
    u_dense_0..Du-1     float32        non-negative, heavy-tailed; ~1% null (the user's value is missing)
    i_cat_0             int64          item id, Zipf over [0, item_vocab_size)
    i_cat_1..I-1        int64          attributes of the item (category, brand, ...), smaller vocabularies
    i_dense_0..Di-1     float32        non-negative, heavy-tailed; ~1% null

Every user-side column holds the same value in every row of a session. The
attributes ``u_cat_k``/``i_cat_k`` (k >= 1) are fixed functions of the id, with
vocabulary ``vocab ** (1 - 0.35 k)`` (at least 2; see :func:`derived_vocab_sizes`);
``u_history`` and ``u_dense_*`` are drawn per session (the user's state at the
time), so a user seen in two sessions keeps their attributes but not their history.
Samples per session: ``round(mean)`` (fixed), ``1 + Poisson(mean - 1)`` or
``Geometric(1 / mean)``, clipped to ``[1, max]``.

Hidden ground truth (not stored): every user segment and item category has a
taste vector; a user's taste is their segment's plus a smaller personal part,
likewise for items. Each user prefers one category (mostly their segment's
best match), which fills half of their history and a third of what they are
shown. The click logit is

    A <taste_u, taste_i> + B share(history in the item's category) + w . log1p(dense) + item bias + noise

with the intercept solved so the click rate is :data:`TARGET_CTR`. All terms
are reachable by a DLRM: dot products of embeddings, pooled history against
the item's category, and log1p dense features, which is what the pipeline's
dense transform computes.

Randomness comes from named streams of ``seed`` (:func:`_rng`) and from id-keyed
hashes, so the same config writes byte-identical Parquet files. Memory: the
per-row arrays (about 100 bytes a row) and every session's history are held at
once; rows with their repeated histories are materialised one shard at a time.
"""

from __future__ import annotations

import itertools
import logging
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from dlrm_platform.config import DataConfig, DatasetSchema, SessionLengthConfig, SideColumns, SyntheticDataConfig
from dlrm_platform.errors import UserError
from dlrm_platform.ingest._mix import hash_bucket, hash_uniform, hash_vectors, salt
from dlrm_platform.ingest.layout import (
    PARQUET_COMPRESSION,
    mark_complete,
    prepare_output_dir,
    shard_path,
    write_schema_yaml,
)

__all__ = [
    "ColumnMismatchError",
    "GenerationReport",
    "SyntheticSamples",
    "arrow_schema",
    "check_declared_columns",
    "derived_vocab_sizes",
    "generate_dataset",
    "sample_dataset",
    "synthetic_schema",
]

log = logging.getLogger(__name__)

TARGET_CTR = 0.3
NULL_RATE = 0.01
TASTE_DIM = 8
PERSONAL_TASTE = 0.5  # weight of the id's own taste vector next to its segment's/category's
IDIOSYNCRATIC_USERS = 0.3  # share of users whose preferred category is their own, not their segment's
HISTORY_FROM_PREFERRED = 0.5  # share of a history drawn from the preferred category
SHOWN_FROM_PREFERRED = 0.3  # share of shown items from the preferred category (a recommender's bias)
TASTE_WEIGHT = 1.2
AFFINITY_WEIGHT = 3.0
DENSE_WEIGHT = 0.5
ITEM_BIAS_WEIGHT = 0.5
LOGIT_NOISE = 0.5
_DENSE_LOG_MEAN = 2.0  # log1p(dense) ~ max(0, N(mean, 1))
_VOCAB_DECAY = 0.35


class ColumnMismatchError(UserError):
    """The job config declares columns the generator does not produce, or misses some it does."""


@dataclass
class GenerationReport:
    """What :func:`generate_dataset` wrote."""

    path: Path
    num_sessions: int
    train_sessions: int
    eval_sessions: int
    train_rows: int
    eval_rows: int
    files: list[Path] = field(default_factory=list)
    bytes: int = 0
    positive_rate: float = 0.0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["files"] = [str(f) for f in self.files]
        return d


# --------------------------------------------------------------------------- schema


def synthetic_schema(cfg: SyntheticDataConfig) -> DatasetSchema:
    """The columns the generator writes for ``cfg``, as a job config declares them."""
    try:
        return DatasetSchema(
            label="label",
            session_key="session_id",
            user=SideColumns(
                dense=[f"u_dense_{k}" for k in range(cfg.num_user_dense)],
                categorical=[f"u_cat_{k}" for k in range(cfg.num_user_categorical)],
                multi_hot=["u_history"],
            ),
            item=SideColumns(
                dense=[f"i_dense_{k}" for k in range(cfg.num_item_dense)],
                categorical=[f"i_cat_{k}" for k in range(cfg.num_item_categorical)],
            ),
        )
    except ValidationError as err:
        raise UserError(f"data.synthetic cannot produce a usable dataset: {err.errors()[0]['msg']}") from None


def arrow_schema(cfg: SyntheticDataConfig) -> pa.Schema:
    """Arrow schema of the generated Parquet files, in column order."""
    s = synthetic_schema(cfg)
    return pa.schema(
        [
            pa.field("session_id", pa.int64(), nullable=False),
            pa.field("label", pa.int64(), nullable=False),
            *(pa.field(c, pa.int64(), nullable=False) for c in s.user.categorical),
            pa.field("u_history", pa.list_(pa.int64()), nullable=False),
            *(pa.field(c, pa.float32()) for c in s.user.dense),
            *(pa.field(c, pa.int64(), nullable=False) for c in s.item.categorical),
            *(pa.field(c, pa.float32()) for c in s.item.dense),
        ]
    )


def check_declared_columns(declared: DatasetSchema, cfg: SyntheticDataConfig) -> None:
    """Raise :class:`ColumnMismatchError` naming every column where ``declared`` and the generator differ.

    Order within a group is free (it only fixes the model's feature order); the
    sets must match, group by group.
    """
    produced = synthetic_schema(cfg)
    problems = []
    for role in ("label", "session_key"):
        want, got = getattr(declared, role), getattr(produced, role)
        if want != got:
            problems.append(f"data.columns.{role}: config says {want!r}, the generator writes {got!r}")
    for side in ("user", "item"):
        for kind in ("dense", "categorical", "multi_hot"):
            want = getattr(getattr(declared, side), kind)
            got = getattr(getattr(produced, side), kind)
            extra = [c for c in want if c not in got]
            missing = [c for c in got if c not in want]
            if extra or missing:
                parts = []
                if extra:
                    parts.append(f"declared but not generated: {extra}")
                if missing:
                    parts.append(f"generated but not declared: {missing}")
                problems.append(f"data.columns.{side}.{kind}: " + "; ".join(parts))
    if problems:
        raise ColumnMismatchError(
            "data.columns does not match what data.synthetic generates:\n  "
            + "\n  ".join(problems)
            + "\nfix data.columns (gen-data writes the right block to schema.yaml) "
            "or the num_* fields of data.synthetic"
        )


# --------------------------------------------------------------------------- sampling primitives


def _rng(seed: int, stream: str) -> np.random.Generator:
    """An independent generator per named stream, so changing one part of the config leaves the others' draws."""
    return np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(stream.encode())])


def derived_vocab_sizes(vocab: int, count: int) -> list[int]:
    """Vocabulary of the id (``vocab``) and of ``count - 1`` attributes derived from it, each coarser."""
    sizes = [vocab]
    for k in range(1, count):
        sizes.append(int(max(2, min(vocab, round(vocab ** max(0.15, 1.0 - _VOCAB_DECAY * k))))))
    return sizes


def _zipf(rng: np.random.Generator, size: int, n: np.ndarray | int, exponent: float) -> np.ndarray:
    """Ranks in [0, n) with P(rank r) roughly proportional to (r + 1) ** -exponent; ``n`` may vary per draw.

    Inverse CDF of the continuous power law on [1, n + 1), floored: exact enough
    and vectorised, unlike numpy's unbounded ``zipf``.
    """
    n = np.asarray(n, dtype=np.float64)
    a = 1.0 - exponent
    u = rng.random(size)
    x = (1.0 + u * ((n + 1.0) ** a - 1.0)) ** (1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, (n - 1).astype(np.int64))


def _session_lengths(rng: np.random.Generator, spec: SessionLengthConfig, size: int) -> np.ndarray:
    """Samples per session, int64 [size], in [1, spec.max], mean spec.mean before clipping at max."""
    if spec.distribution == "fixed":
        lengths = np.full(size, round(spec.mean), dtype=np.int64)
    elif spec.distribution == "poisson":
        lengths = 1 + rng.poisson(spec.mean - 1.0, size)  # shifted so that the mean is exact and 0 impossible
    else:
        lengths = rng.geometric(1.0 / spec.mean, size)
    return np.clip(lengths, 1, spec.max).astype(np.int64)


def _concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concat([arange(s, s + l) for s, l in zip(starts, lengths)])`` without the Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    out_starts = np.cumsum(lengths) - lengths
    return np.repeat(starts - out_starts, lengths) + np.arange(total, dtype=np.int64)


def _dense_values(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Heavy-tailed non-negative values (float32, NaN = missing) and their hidden log1p (float64, never missing)."""
    logs = np.maximum(0.0, rng.normal(_DENSE_LOG_MEAN, 1.0, shape))
    values = np.expm1(logs).astype(np.float32)
    values[rng.random(shape) < NULL_RATE] = np.nan
    return values, logs


# --------------------------------------------------------------------------- the hidden world


def _signed_weights(rng: np.random.Generator, n: int) -> np.ndarray:
    """float64 [n], magnitudes in [0.5, 1), random signs."""
    return rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 1.0, n)


class _World:
    """Hidden structure of one seed: id attributes, taste vectors, preferred categories, weights."""

    def __init__(self, cfg: SyntheticDataConfig) -> None:
        self.cfg = cfg
        seed = cfg.seed
        self.user_vocab = derived_vocab_sizes(cfg.user_vocab_size, max(cfg.num_user_categorical, 2))
        self.item_vocab = derived_vocab_sizes(cfg.item_vocab_size, max(cfg.num_item_categorical, 2))
        self.num_segments, self.num_categories = self.user_vocab[1], self.item_vocab[1]

        # Items grouped by category, so "an item of category c" is a Zipf draw within its slice.
        self.item_category = self.item_attribute(np.arange(cfg.item_vocab_size, dtype=np.int64), 1)
        self.items_by_category = np.argsort(self.item_category, kind="stable")
        self.category_size = np.bincount(self.item_category, minlength=self.num_categories)
        self.category_start = np.cumsum(self.category_size) - self.category_size

        self.segment_taste = hash_vectors(np.arange(self.num_segments), TASTE_DIM, salt("segment_taste", seed))
        self.category_taste = hash_vectors(np.arange(self.num_categories), TASTE_DIM, salt("category_taste", seed))
        self.segment_preference = self._best_categories(self.segment_taste)

        rng = _rng(seed, "weights")
        self.user_dense_weight = DENSE_WEIGHT * _signed_weights(rng, cfg.num_user_dense)
        self.item_dense_weight = DENSE_WEIGHT * _signed_weights(rng, cfg.num_item_dense)

    def _best_categories(self, taste: np.ndarray, block: int = 1024) -> np.ndarray:
        """Argmax over non-empty categories of taste . category_taste, int64 [len(taste)]; blocked for memory."""
        empty = self.category_size == 0
        out = np.empty(len(taste), dtype=np.int64)
        for i in range(0, len(taste), block):
            scores = taste[i : i + block] @ self.category_taste.T
            scores[:, empty] = -np.inf
            out[i : i + block] = scores.argmax(axis=1)
        return out

    def user_attribute(self, user_id: np.ndarray, k: int) -> np.ndarray:
        return user_id if k == 0 else hash_bucket(user_id, self.user_vocab[k], salt(f"u_cat_{k}", self.cfg.seed))

    def item_attribute(self, item_id: np.ndarray, k: int) -> np.ndarray:
        return item_id if k == 0 else hash_bucket(item_id, self.item_vocab[k], salt(f"i_cat_{k}", self.cfg.seed))

    def user_taste(self, user_id: np.ndarray) -> np.ndarray:
        personal = hash_vectors(user_id, TASTE_DIM, salt("user_taste", self.cfg.seed))
        return self.segment_taste[self.user_attribute(user_id, 1)] + PERSONAL_TASTE * personal

    def item_taste(self, item_id: np.ndarray) -> np.ndarray:
        personal = hash_vectors(item_id, TASTE_DIM, salt("item_taste", self.cfg.seed))
        return self.category_taste[self.item_category[item_id]] + PERSONAL_TASTE * personal

    def preferred_category(self, user_id: np.ndarray) -> np.ndarray:
        own = self._best_categories(hash_vectors(user_id, TASTE_DIM, salt("own_taste", self.cfg.seed)))
        idiosyncratic = hash_uniform(user_id, salt("idiosyncratic", self.cfg.seed)) < IDIOSYNCRATIC_USERS
        return np.where(idiosyncratic, own, self.segment_preference[self.user_attribute(user_id, 1)])

    def draw_items(self, rng: np.random.Generator, preferred: np.ndarray, share: float) -> np.ndarray:
        """One item per entry of ``preferred``: from that category with probability ``share``, else from all items."""
        n = len(preferred)
        items = _zipf(rng, n, self.cfg.item_vocab_size, self.cfg.zipf_exponent)
        from_pref = rng.random(n) < share
        cats = preferred[from_pref]
        pos = _zipf(rng, len(cats), self.category_size[cats], self.cfg.zipf_exponent)
        items[from_pref] = self.items_by_category[self.category_start[cats] + pos]
        return items


# --------------------------------------------------------------------------- the samples


@dataclass(frozen=True)
class SyntheticSamples:
    """Every sample of a generated dataset, session-clustered (sessions in id order). S sessions, N samples.

    Per session: ``user_categorical`` int64 [S, U] (column 0 the user id),
    ``user_dense`` float32 [S, Du] (NaN = missing), ``history_offsets`` int64 [S + 1]
    into ``history_values`` int64 [H], ``session_length`` int64 [S],
    ``session_start`` int64 [S] (first row of the session).
    Per sample: ``session_index`` int64 [N], ``item_categorical`` int64 [N, I],
    ``item_dense`` float32 [N, Di], ``label`` int64 [N], and the hidden
    ``true_logit`` float64 [N] (noise-free: ranking by it is Bayes-optimal).
    """

    user_categorical: np.ndarray
    user_dense: np.ndarray
    history_offsets: np.ndarray
    history_values: np.ndarray
    session_length: np.ndarray
    session_start: np.ndarray
    session_index: np.ndarray
    item_categorical: np.ndarray
    item_dense: np.ndarray
    label: np.ndarray
    true_logit: np.ndarray

    @property
    def num_sessions(self) -> int:
        return len(self.session_length)

    @property
    def num_rows(self) -> int:
        return len(self.session_index)

    def table(self, rows: np.ndarray, cfg: SyntheticDataConfig) -> pa.Table:
        """The Arrow table (:func:`arrow_schema`) of sample indices ``rows``, in that order."""
        sess = self.session_index[rows]
        hist_start = self.history_offsets[sess]
        hist_len = self.history_offsets[sess + 1] - hist_start
        offsets = np.concatenate([[0], np.cumsum(hist_len)]).astype(np.int32)
        history = pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(self.history_values[_concat_ranges(hist_start, hist_len)])
        )
        columns: list[pa.Array] = [pa.array(sess.astype(np.int64)), pa.array(self.label[rows])]
        columns += [pa.array(self.user_categorical[sess, k]) for k in range(cfg.num_user_categorical)]
        columns.append(history)
        columns += [_nullable_float(self.user_dense[sess, k]) for k in range(cfg.num_user_dense)]
        columns += [pa.array(self.item_categorical[rows, k]) for k in range(cfg.num_item_categorical)]
        columns += [_nullable_float(self.item_dense[rows, k]) for k in range(cfg.num_item_dense)]
        return pa.Table.from_arrays(columns, schema=arrow_schema(cfg))


def _nullable_float(values: np.ndarray) -> pa.Array:
    return pa.array(values, type=pa.float32(), from_pandas=True)  # from_pandas: NaN -> null


def _solve_intercept(logit: np.ndarray, target: float) -> float:
    """Intercept b with mean(sigmoid(logit + b)) == target, by bisection (the mean is monotone in b)."""
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sample_dataset(cfg: SyntheticDataConfig) -> SyntheticSamples:
    """Draw every session and sample of ``cfg`` in memory (vectorised; a few seconds per million rows)."""
    world = _World(cfg)
    num = cfg.num_sessions

    rng = _rng(cfg.seed, "users")
    user_id = _zipf(rng, num, cfg.user_vocab_size, cfg.zipf_exponent)
    user_categorical = np.stack(
        [world.user_attribute(user_id, k) for k in range(cfg.num_user_categorical)], axis=1
    )
    user_dense, user_dense_log = _dense_values(_rng(cfg.seed, "user_dense"), (num, cfg.num_user_dense))
    preferred = world.preferred_category(user_id)

    rng = _rng(cfg.seed, "history")
    lo, hi = cfg.history_length
    hist_len = rng.integers(lo, hi + 1, num)
    history_offsets = np.concatenate([[0], np.cumsum(hist_len)]).astype(np.int64)
    history_values = world.draw_items(rng, np.repeat(preferred, hist_len), HISTORY_FROM_PREFERRED)

    session_length = _session_lengths(_rng(cfg.seed, "session_length"), cfg.samples_per_session, num)
    session_start = np.cumsum(session_length) - session_length
    session_index = np.repeat(np.arange(num, dtype=np.int64), session_length)
    n = len(session_index)

    item_id = world.draw_items(_rng(cfg.seed, "items"), preferred[session_index], SHOWN_FROM_PREFERRED)
    item_categorical = np.stack([world.item_attribute(item_id, k) for k in range(cfg.num_item_categorical)], axis=1)
    item_dense, item_dense_log = _dense_values(_rng(cfg.seed, "item_dense"), (n, cfg.num_item_dense))

    taste = np.einsum(
        "nd,nd->n", world.user_taste(user_id)[session_index], world.item_taste(item_id)
    ) / np.sqrt(TASTE_DIM)
    affinity = _history_share_in_category(
        history_offsets, world.item_category[history_values], session_index, world.item_category[item_id]
    )
    logit = (
        TASTE_WEIGHT * taste
        + AFFINITY_WEIGHT * affinity
        + ((user_dense_log - _DENSE_LOG_MEAN) @ world.user_dense_weight)[session_index]
        + (item_dense_log - _DENSE_LOG_MEAN) @ world.item_dense_weight
        + ITEM_BIAS_WEIGHT * hash_vectors(item_id, 1, salt("item_bias", cfg.seed))[:, 0]
    )
    rng = _rng(cfg.seed, "labels")
    noisy = logit + rng.normal(0.0, LOGIT_NOISE, n)
    intercept = _solve_intercept(noisy, TARGET_CTR)
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-(noisy + intercept)))).astype(np.int64)

    return SyntheticSamples(
        user_categorical=user_categorical,
        user_dense=user_dense,
        history_offsets=history_offsets,
        history_values=history_values,
        session_length=session_length,
        session_start=session_start,
        session_index=session_index,
        item_categorical=item_categorical,
        item_dense=item_dense,
        label=label,
        true_logit=logit + intercept,
    )


def _history_share_in_category(
    history_offsets: np.ndarray, history_category: np.ndarray, session_index: np.ndarray, item_category: np.ndarray
) -> np.ndarray:
    """Per sample, the share of its session's history whose category is the sample item's, float64 [N]."""
    num_sessions = len(history_offsets) - 1
    hist_session = np.repeat(np.arange(num_sessions, dtype=np.int64), np.diff(history_offsets))
    stride = int(max(history_category.max(initial=0), item_category.max(initial=0))) + 1
    keys, counts = np.unique(hist_session * stride + history_category, return_counts=True)
    query = session_index * stride + item_category
    pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    hits = np.where(keys[pos] == query, counts[pos], 0)
    return hits / np.diff(history_offsets)[session_index]


# --------------------------------------------------------------------------- writing


def _split_sessions(cfg: SyntheticDataConfig) -> np.ndarray:
    """bool [num_sessions]: True for the eval sessions (a random eval_fraction, at least one per split)."""
    num = cfg.num_sessions
    if num < 2:
        raise UserError("data.synthetic.num_sessions must be at least 2: one train and one eval session")
    num_eval = int(np.clip(round(num * cfg.eval_fraction), 1, num - 1))
    is_eval = np.zeros(num, dtype=bool)
    is_eval[_rng(cfg.seed, "split").permutation(num)[:num_eval]] = True
    return is_eval


def _shard_bounds(num_rows: int, rows_per_shard: int, session_starts: np.ndarray | None) -> list[tuple[int, int]]:
    """[start, end) row ranges of shards; with ``session_starts`` (clustered layout) cuts only between sessions."""
    cuts = np.arange(rows_per_shard, num_rows, rows_per_shard)
    if session_starts is not None:
        idx = np.searchsorted(session_starts, cuts)
        cuts = np.unique(session_starts[idx[idx < len(session_starts)]])
    edges = [0, *(int(c) for c in cuts if 0 < c < num_rows), num_rows]
    return list(itertools.pairwise(edges))


def _write_split(
    samples: SyntheticSamples, cfg: SyntheticDataConfig, sessions: np.ndarray, split_dir: Path, name: str, bar: Any
) -> list[Path]:
    """Write the rows of ``sessions`` (sorted indices) into ``split_dir`` shards; returns the files."""
    lengths = samples.session_length[sessions]
    rows = _concat_ranges(samples.session_start[sessions], lengths)
    session_starts: np.ndarray | None = None
    if cfg.layout == "random":
        rows = rows[_rng(cfg.seed, f"layout/{name}").permutation(len(rows))]
    else:
        session_starts = np.cumsum(lengths) - lengths
    files = []
    for i, (start, end) in enumerate(_shard_bounds(len(rows), cfg.rows_per_shard, session_starts)):
        path = shard_path(split_dir, i)
        pq.write_table(samples.table(rows[start:end], cfg), path, compression=PARQUET_COMPRESSION)
        files.append(path)
        bar.update(end - start)
    return files


def generate_dataset(data: DataConfig, *, overwrite: bool = False, progress: bool = True) -> GenerationReport:
    """Generate ``data.synthetic`` into ``data.path`` (train/eval shards, schema.yaml, then _SUCCESS).

    Raises :class:`ColumnMismatchError` when ``data.columns`` differs from what
    is generated, and :class:`UserError` when the directory already holds a
    complete dataset and ``overwrite`` is false. An unfinished directory (no
    ``_SUCCESS``) is cleared and regenerated.
    """
    from tqdm.auto import tqdm

    cfg = data.synthetic
    if cfg is None:
        raise UserError("data.synthetic is not set: this config's dataset is not generated (nothing to do)")
    check_declared_columns(data.columns, cfg)
    if data.train_split == data.eval_split:
        raise UserError(f"data.train_split and data.eval_split are both {data.train_split!r}; they must differ")
    is_eval = _split_sessions(cfg)
    splits = {data.train_split: np.flatnonzero(~is_eval), data.eval_split: np.flatnonzero(is_eval)}
    prepare_output_dir(data.path, list(splits), overwrite=overwrite, command="gen-data")

    t0 = time.perf_counter()
    if progress:
        log.info("sampling %d sessions (seed %d)", cfg.num_sessions, cfg.seed)
    samples = sample_dataset(cfg)
    files: list[Path] = []
    rows = {}
    with tqdm(total=samples.num_rows, unit="row", unit_scale=True, desc="gen-data", disable=not progress) as bar:
        for name, sessions in splits.items():
            files += _write_split(samples, cfg, sessions, data.split_dir(name), name, bar)
            rows[name] = int(samples.session_length[sessions].sum())
    write_schema_yaml(
        data.path,
        synthetic_schema(cfg),
        header=f"Written by `dlrm-platform gen-data` (seed {cfg.seed}, {cfg.num_sessions} sessions).\n"
        "Paste under `data:` in a job config.",
    )
    mark_complete(data.path)
    return GenerationReport(
        path=data.path,
        num_sessions=cfg.num_sessions,
        train_sessions=len(splits[data.train_split]),
        eval_sessions=len(splits[data.eval_split]),
        train_rows=rows[data.train_split],
        eval_rows=rows[data.eval_split],
        files=files,
        bytes=sum(f.stat().st_size for f in files),
        positive_rate=float(samples.label.mean()),
        seconds=time.perf_counter() - t0,
    )
