"""Load on the job service: 200 concurrent status polls and 20 submissions at once.

    python benchmarks/api_load.py --url http://127.0.0.1:8000 [--api-key KEY] [--json PATH]
    python benchmarks/api_load.py            # self-contained: starts its own service (no Ray)

Against a running service (`make serve`, key from DLRM_API_KEY) the submissions
are real jobs: they are cancelled at the end unless --keep. Self-contained, the
service runs on a temporary sqlite database with no Ray cluster reachable, so
the jobs stay queued: that measures the API itself (HTTP, auth, database).
Prints the error count and p50/p99 latency of reads and writes; the target on
the 2-core development machine is zero errors and p99 under 200 ms for reads.

Sustained mixed load (``--duration SECONDS``; ``make bench-api-soak`` runs 300 s self-contained):

    python benchmarks/api_load.py --duration 300 [--clients 16] [--rate 40] [--json PATH]
    python benchmarks/api_load.py --duration 300 --url http://127.0.0.1:8000 --pid PID

``--clients`` loops, together at most ``--rate`` requests/s, each request one of: submit, poll a
job, list jobs, read a job's logs, follow a job's logs (streamed: the client hangs up after a
second or two, or the job is cancelled and the stream must end by itself), cancel. Loopback
only. Meanwhile the API process's open file descriptors (/proc/PID/fd), its sockets, threads and
RSS are sampled every second. Prints errors, p50/p99 per request kind, and the resources at the
start, after warm-up and at the end with their slope. Exit status 1 on any error or when, after
warm-up, fds other than sockets grow by more than --max-fd-growth, RSS by more than
--max-rss-growth-mib, or the process keeps more sockets once the clients have gone than it had
before they came.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import aiohttp

ROOT = Path(__file__).resolve().parents[1]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


async def timed(session: aiohttp.ClientSession, method: str, url: str, **kw) -> tuple[float, int | None, dict | None]:
    t = time.perf_counter()
    try:
        async with session.request(method, url, **kw) as r:
            body = await r.json() if r.content_type == "application/json" else await r.read()
            return (time.perf_counter() - t) * 1000, r.status, body if isinstance(body, dict) else None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return (time.perf_counter() - t) * 1000, None, None


def server_side_ms(metrics_text: str, route: str, method: str) -> dict[str, float]:
    """p50/p99 from the service's own latency histogram (bucket upper bounds), for comparison."""
    buckets: list[tuple[float, float]] = []
    for line in metrics_text.splitlines():
        if line.startswith("dlrm_api_request_duration_seconds_bucket") and f'route="{route}"' in line and f'method="{method}"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return {}
    total = buckets[-1][1]
    out = {}
    for q in (50, 99):
        out[f"p{q}_ms_le"] = next(le for le, n in buckets if n >= total * q / 100) * 1000
    return out


async def run_load(url: str, key: str, polls: int, submissions: int, config_name: str, keep: bool) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=polls + submissions)
    body = {"config_name": config_name, "priority": -1000, "max_retries": 0, "overrides": {"name": "api-load"}}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(base_url=url, headers=headers, connector=connector, timeout=timeout) as c:
        # A job to poll, and warm connections.
        _, code, seed = await timed(c, "POST", "/v1/jobs", json=body)
        if code != 201 or seed is None:
            raise SystemExit(f"seed submission failed: HTTP {code}")
        # Pollers keep their connections open: open one per concurrent client first, so that the burst
        # measures requests rather than 220 simultaneous TCP handshakes.
        await asyncio.gather(*(timed(c, "GET", "/healthz") for _ in range(polls + submissions)))
        job_id = seed["id"]
        started = time.perf_counter()
        results = await asyncio.gather(
            *(timed(c, "POST", "/v1/jobs", json=body) for _ in range(submissions)),
            *(timed(c, "GET", f"/v1/jobs/{job_id}") for _ in range(polls)),
        )
        wall = time.perf_counter() - started
        writes, reads = results[:submissions], results[submissions:]
        ids = [job_id] + [b["id"] for _, code, b in writes if code == 201 and b]
        if not keep:
            await asyncio.gather(*(timed(c, "POST", f"/v1/jobs/{i}/cancel") for i in ids))
        async with c.get("/metrics") as r:
            metrics_text = await r.text()
    read_ms = [t for t, code, _ in reads if code == 200]
    write_ms = [t for t, code, _ in writes if code == 201]
    errors = sum(code != 200 for _, code, _ in reads) + sum(code != 201 for _, code, _ in writes)
    return {
        "url": url,
        "polls": polls,
        "submissions": submissions,
        "errors": errors,
        "wall_s": round(wall, 3),
        "read_p50_ms": round(percentile(read_ms, 50), 1),
        "read_p99_ms": round(percentile(read_ms, 99), 1),
        "read_mean_ms": round(statistics.fmean(read_ms), 1) if read_ms else None,
        "write_p50_ms": round(percentile(write_ms, 50), 1),
        "write_p99_ms": round(percentile(write_ms, 99), 1),
        "all_p50_ms": round(percentile(read_ms + write_ms, 50), 1),
        "all_p99_ms": round(percentile(read_ms + write_ms, 99), 1),
        "requests_per_s": round((len(reads) + len(writes)) / wall, 1),
        "server_read_ms": server_side_ms(metrics_text, "/v1/jobs/{job_id}", "GET"),
        "cancelled": 0 if keep else len(ids),
    }


# --------------------------------------------------------------------------- sustained mixed load

KIND_WEIGHTS = {"poll": 40, "list": 15, "submit": 14, "cancel": 10, "logs": 8, "follow": 13}
MAX_LIVE_JOBS = 100  # queued jobs kept for polls and follows; at this many, a submission becomes a cancel
FOLLOW_END_S = 15.0  # a followed job that was cancelled must end its stream within this


def proc_sample(pid: int) -> dict[str, float]:
    """Open fds, sockets among them, the other fds (files: the database, pipes, ...), threads and RSS (MiB)
    of a local process, from /proc."""
    fds = sockets = 0
    for fd in os.scandir(f"/proc/{pid}/fd"):
        fds += 1
        try:
            sockets += os.readlink(fd.path).startswith("socket:")
        except OSError:  # closed meanwhile
            pass
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "fds": fds,
        "sockets": sockets,
        "files": fds - sockets,
        "threads": int(fields["Threads"]),
        "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 2),
    }


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    mt = statistics.fmean(t for t, _ in points)
    mv = statistics.fmean(v for _, v in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if den == 0 else 60 * sum((t - mt) * (v - mv) for t, v in points) / den


def resource_report(samples: list[dict], warmup_s: float) -> dict[str, dict[str, float]]:
    """Per resource: value at start, after warm-up, at the end (medians of the first/last 10% of the
    samples after warm-up, so that one burst does not decide), growth after warm-up, slope after it."""
    after = [s for s in samples if s["t"] >= warmup_s] or samples
    k = max(1, len(after) // 10)
    out = {}
    for key in ("fds", "sockets", "files", "threads", "rss_mib"):
        warm = statistics.median(s[key] for s in after[:k])
        end = statistics.median(s[key] for s in after[-k:])
        out[key] = {
            "start": samples[0][key],
            "after_warmup": warm,
            "end": end,
            "max": max(s[key] for s in samples),
            "growth_after_warmup": round(end - warm, 2),
            "slope_per_min": round(slope_per_min([(s["t"], s[key]) for s in after]), 3),
        }
    return out


class Mix:
    """What the load's clients share: the jobs they may poll, follow and cancel, and every outcome."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.live: list[str] = []  # queued, not cancelled: may be followed or cancelled
        self.known: list[str] = []  # every job submitted: may be polled (bounded sample below)
        self.ms: dict[str, list[float]] = {k: [] for k in KIND_WEIGHTS}
        self.errors: dict[str, int] = {}
        self.error_examples: list[str] = []
        self.count: dict[str, int] = {k: 0 for k in KIND_WEIGHTS}

    def ok(self, kind: str, ms: float) -> None:
        self.count[kind] += 1
        self.ms[kind].append(ms)

    def error(self, kind: str, what: str) -> None:
        self.count[kind] += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.error_examples) < 20:
            self.error_examples.append(f"{kind}: {what}")

    def pick_kind(self) -> str:
        kind = self.rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
        if kind in ("cancel", "follow", "logs", "poll") and not self.live:
            return "submit"
        if kind == "submit" and len(self.live) >= MAX_LIVE_JOBS:
            return "cancel"
        return kind

    def take_live(self) -> str | None:
        return self.live.pop(self.rng.randrange(len(self.live))) if self.live else None


async def one_request(c: aiohttp.ClientSession, mix: Mix, body: dict) -> None:
    kind = mix.pick_kind()
    t = time.perf_counter()
    try:
        if kind == "submit":
            async with c.post("/v1/jobs", json=body) as r:
                data = await r.json()
                if r.status != 201:
                    return mix.error(kind, f"HTTP {r.status}")
            mix.live.append(data["id"])
            mix.known.append(data["id"])
            if len(mix.known) > 1000:
                del mix.known[:500]
        elif kind == "poll":
            job = mix.rng.choice(mix.known)
            async with c.get(f"/v1/jobs/{job}") as r:
                await r.read()
                if r.status != 200:
                    return mix.error(kind, f"HTTP {r.status}")
        elif kind == "list":
            params = {"limit": str(mix.rng.choice((10, 50, 200)))}
            if mix.rng.random() < 0.5:
                params["status"] = mix.rng.choice(("QUEUED", "STOPPED"))
            async with c.get("/v1/jobs", params=params) as r:
                await r.read()
                if r.status != 200:
                    return mix.error(kind, f"HTTP {r.status}")
        elif kind == "logs":
            async with c.get(f"/v1/jobs/{mix.rng.choice(mix.live)}/logs") as r:
                await r.read()
                if r.status != 200:
                    return mix.error(kind, f"HTTP {r.status}")
        elif kind == "cancel":
            job = mix.take_live()
            if job is None:
                return
            async with c.post(f"/v1/jobs/{job}/cancel") as r:
                await r.read()
                if r.status != 202:
                    return mix.error(kind, f"HTTP {r.status} for {job}")
        elif kind == "follow":
            return await follow(c, mix, t)
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as err:
        return mix.error(kind, f"{type(err).__name__}: {err}")
    mix.ok(kind, (time.perf_counter() - t) * 1000)


async def follow(c: aiohttp.ClientSession, mix: Mix, t: float) -> None:
    """Follow a queued job's logs: hang up after a while, or cancel it and wait for the stream to end.
    The latency recorded is the time to the response's headers."""
    cancel = mix.rng.random() < 0.5
    job = mix.take_live() if cancel else mix.rng.choice(mix.live)
    if job is None:
        return
    async with c.get(f"/v1/jobs/{job}/logs", params={"follow": "true"}) as r:
        if r.status != 200:
            return mix.error("follow", f"HTTP {r.status}")
        mix.ok("follow", (time.perf_counter() - t) * 1000)
        if not cancel:
            # The client goes away mid-stream: the service must drop the stream and its connection.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(r.content.read(), timeout=mix.rng.uniform(0.5, 2.5))
            r.close()
            return
        async with c.post(f"/v1/jobs/{job}/cancel") as rc:
            await rc.read()
            if rc.status != 202:
                return mix.error("cancel", f"HTTP {rc.status} for followed {job}")
        try:
            await asyncio.wait_for(r.content.read(), timeout=FOLLOW_END_S)
        except asyncio.TimeoutError:
            return mix.error("follow", f"the stream of cancelled {job} did not end within {FOLLOW_END_S:.0f} s")


async def run_sustained(url: str, key: str, *, duration: float, clients: int, rate: float, warmup_s: float,
                        config_name: str, pid: int | None, seed: int) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    body = {"config_name": config_name, "priority": -1000, "max_retries": 0, "overrides": {"name": "api-soak"}}
    mix = Mix(seed)
    samples: list[dict] = []
    started = time.monotonic()
    stop = asyncio.Event()

    async def sampler() -> None:
        while not stop.is_set():
            samples.append({"t": round(time.monotonic() - started, 2), **proc_sample(pid)})
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass

    before = proc_sample(pid) if pid else None
    connector = aiohttp.TCPConnector(limit=clients * 2)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(base_url=url, headers=headers, connector=connector, timeout=timeout) as c:
        sampling = asyncio.create_task(sampler()) if pid else None

        async def client(i: int) -> None:
            period = clients / rate  # each client's share of the rate
            nxt = time.monotonic() + period * i / clients
            while (now := time.monotonic()) < started + duration:
                if nxt > now:
                    await asyncio.sleep(nxt - now)
                nxt = max(nxt + period, time.monotonic() - period)  # no catching up in bursts
                await one_request(c, mix, body)

        await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.monotonic() - started
        stop.set()
        if sampling is not None:
            await sampling
        # Leave no job behind on a running service.
        await asyncio.gather(*(c.post(f"/v1/jobs/{j}/cancel") for j in mix.live), return_exceptions=True)
    after_close = None
    if pid:
        await asyncio.sleep(3.0)  # the service notices the closed connections
        after_close = proc_sample(pid)
    kinds = {}
    for kind, ms in mix.ms.items():
        kinds[kind] = {
            "requests": mix.count[kind],
            "errors": mix.errors.get(kind, 0),
            "p50_ms": round(percentile(ms, 50), 1),
            "p99_ms": round(percentile(ms, 99), 1),
        }
    total = sum(mix.count.values())
    return {
        "url": url,
        "duration_s": round(wall, 1),
        "clients": clients,
        "rate_limit_per_s": rate,
        "warmup_s": warmup_s,
        "requests": total,
        "requests_per_s": round(total / wall, 1),
        "errors": sum(mix.errors.values()),
        "error_examples": mix.error_examples,
        "kinds": kinds,
        "jobs_submitted": mix.count["submit"] - mix.errors.get("submit", 0),
        "process": {
            "pid": pid,
            "before_load": before,
            "after_clients_closed": after_close,
            "resources": resource_report(samples, warmup_s) if samples else None,
            "samples": samples,
        },
    }


def sustained_verdict(out: dict, max_fd_growth: float, max_rss_growth_mib: float) -> list[str]:
    """Why the run fails (empty: it passes)."""
    why = []
    if out["errors"]:
        why.append(f"{out['errors']} errors: {out['error_examples'][:5]}")
    proc = out["process"]
    res = proc["resources"]
    if res is None:
        return why
    # Sockets come and go with the clients' connections (more in flight when responses are slow): they
    # are checked once the clients have gone, below. Every other fd must stay flat under the load.
    if res["files"]["growth_after_warmup"] > max_fd_growth:
        why.append(f"open fds other than sockets grew by {res['files']['growth_after_warmup']} after warm-up "
                   f"(bound {max_fd_growth})")
    if res["rss_mib"]["growth_after_warmup"] > max_rss_growth_mib:
        why.append(f"RSS grew by {res['rss_mib']['growth_after_warmup']:.1f} MiB after warm-up "
                   f"(bound {max_rss_growth_mib} MiB)")
    before, after = proc["before_load"], proc["after_clients_closed"]
    if before and after and after["sockets"] > before["sockets"]:
        why.append(f"sockets left open after the clients went: {after['sockets']} (before the load: {before['sockets']})")
    return why


def print_sustained(out: dict, mode: str) -> None:
    print(f"api_load sustained ({mode}) at {out['url']}: {out['duration_s']:.0f} s, {out['clients']} clients, "
          f"<= {out['rate_limit_per_s']:.0f} req/s; {out['requests']} requests ({out['requests_per_s']:.1f}/s), "
          f"{out['jobs_submitted']} jobs submitted")
    print(f"  errors            {out['errors']}" + (f"  e.g. {out['error_examples'][:3]}" if out["errors"] else ""))
    for kind, k in out["kinds"].items():
        print(f"  {kind:<8} p50/p99   {k['p50_ms']:.1f} / {k['p99_ms']:.1f} ms   ({k['requests']} requests, "
              f"{k['errors']} errors)")
    res = out["process"]["resources"]
    if res is None:
        print("  resources         not sampled (give --pid with --url)")
        return
    for key, unit in (("fds", ""), ("sockets", ""), ("files", ""), ("threads", ""), ("rss_mib", " MiB")):
        r = res[key]
        print(f"  {key:<8} start {r['start']}{unit}, after warm-up {r['after_warmup']}{unit}, end {r['end']}{unit} "
              f"(max {r['max']}), growth {r['growth_after_warmup']:+}{unit}, slope {r['slope_per_min']:+.3f}/min")
    b, a = out["process"]["before_load"], out["process"]["after_clients_closed"]
    print(f"  clients gone      fds {b['fds']} -> {a['fds']}, sockets {b['sockets']} -> {a['sockets']}, "
          f"threads {b['threads']} -> {a['threads']}, RSS {b['rss_mib']} -> {a['rss_mib']} MiB")


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def self_contained_service(tmp: Path) -> tuple[subprocess.Popen, str, str]:
    sys.path.insert(0, str(ROOT / "platform"))
    from dlrm_platform.api.auth import create_api_key
    from dlrm_platform.api.db import Database
    from dlrm_platform.api.devstack import free_port, start_api

    db_url = f"sqlite:///{tmp / 'jobs.db'}"
    db = Database(db_url)
    with db.transaction() as s:
        _, key = create_api_key(s, "loadtest")
    db.dispose()
    port = free_port()
    env = {
        "DLRM_API_DATABASE_URL": db_url,
        "DLRM_API_RAY_ADDRESS": f"http://127.0.0.1:{free_port()}",  # nothing listens: jobs stay queued
        "DLRM_API_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}",
        "DLRM_API_STORAGE_DIR": str(tmp / "storage"),
        "DLRM_API_CONFIGS_DIR": str(ROOT / "configs"),
        # This checkout's service, whatever the environment has installed.
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "platform"), os.environ.get("PYTHONPATH")) if p),
    }
    proc = start_api(port=port, env=env, cwd=ROOT, log_file=tmp / "api.log")
    return proc, f"http://127.0.0.1:{port}", key


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running service; default: start one (no Ray)")
    ap.add_argument("--api-key", default=os.environ.get("DLRM_API_KEY"))
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--submissions", type=int, default=20)
    ap.add_argument("--config-name", default="demo")
    ap.add_argument("--keep", action="store_true", help="do not cancel the submitted jobs")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    soak = ap.add_argument_group("sustained mixed load")
    soak.add_argument("--duration", type=float, help="run the sustained mixed load for SECONDS (e.g. 300)")
    soak.add_argument("--clients", type=int, default=16, help="concurrent client loops")
    soak.add_argument("--rate", type=float, default=40.0, help="requests per second, all clients together, at most")
    soak.add_argument("--warmup", type=float, help="seconds before fds/RSS count as steady (default: 20%% of "
                      "--duration, at least 10)")
    soak.add_argument("--pid", type=int, help="the API process to sample with --url (self-contained: its own)")
    soak.add_argument("--max-fd-growth", type=float, default=16,
                      help="open fds other than sockets may grow this much after warm-up (default 16: the "
                      "database pool may still open connections as concurrency peaks, 2 fds each, the file "
                      "and its WAL; one fd leaked per request would be thousands)")
    soak.add_argument("--max-rss-growth-mib", type=float, default=48,
                      help="RSS may grow this much after warm-up (default 48 MiB: sqlite's page cache, 2 MiB "
                      "per pooled connection, fills as the job table grows, and threads the pool adds under "
                      "contention keep their malloc arenas; a leak of 10 kB per request (half a rendered "
                      "job view) would be over 75 MiB in the 4 minutes after warm-up at 35 requests/s)")
    soak.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if args.duration is not None:
        return main_sustained(args)

    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="dlrm-api-load-")
    try:
        if args.url:
            if not args.api_key:
                raise SystemExit("--api-key or DLRM_API_KEY is required with --url")
            url, key, mode = args.url, args.api_key, "running service"
        else:
            proc, url, key = self_contained_service(Path(tmp.name))
            mode = "self-contained service (no Ray: jobs stay queued)"
        out = asyncio.run(run_load(url, key, args.polls, args.submissions, args.config_name, args.keep))
    finally:
        if proc is not None:
            from dlrm_platform.api.devstack import stop_process

            stop_process(proc)
        tmp.cleanup()
    out["mode"] = mode
    print(f"api_load ({mode}) at {out['url']}: {args.polls} concurrent status polls + {args.submissions} submissions")
    print(f"  errors            {out['errors']}")
    print(f"  reads   p50/p99   {out['read_p50_ms']:.1f} / {out['read_p99_ms']:.1f} ms   (target p99 < 200 ms)")
    print(f"  writes  p50/p99   {out['write_p50_ms']:.1f} / {out['write_p99_ms']:.1f} ms")
    print(f"  all     p50/p99   {out['all_p50_ms']:.1f} / {out['all_p99_ms']:.1f} ms, {out['requests_per_s']:.0f} req/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 1 if out["errors"] else 0


def main_sustained(args: argparse.Namespace) -> int:
    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="dlrm-api-soak-")
    warmup = args.warmup if args.warmup is not None else max(10.0, 0.2 * args.duration)
    try:
        if args.url:
            if not args.api_key:
                raise SystemExit("--api-key or DLRM_API_KEY is required with --url")
            if not is_loopback(args.url):
                raise SystemExit(f"the sustained load runs against a local service only, not {args.url}")
            url, key, pid, mode = args.url, args.api_key, args.pid, "running service"
        else:
            proc, url, key = self_contained_service(Path(tmp.name))
            pid, mode = proc.pid, "self-contained service (no Ray: jobs stay queued)"
        out = asyncio.run(run_sustained(
            url, key, duration=args.duration, clients=args.clients, rate=args.rate, warmup_s=warmup,
            config_name=args.config_name, pid=pid, seed=args.seed,
        ))  # fmt: skip
    finally:
        if proc is not None:
            from dlrm_platform.api.devstack import stop_process

            stop_process(proc)
        tmp.cleanup()
    out["mode"] = mode
    why = sustained_verdict(out, args.max_fd_growth, args.max_rss_growth_mib)
    out["bounds"] = {"max_fd_growth": args.max_fd_growth, "max_rss_growth_mib": args.max_rss_growth_mib}
    out["failed"] = why
    print_sustained(out, mode)
    print("  verdict           " + ("PASS" if not why else "FAIL: " + "; ".join(why)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main())
