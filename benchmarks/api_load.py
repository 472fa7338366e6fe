"""Load on the job service: 200 concurrent status polls and 20 submissions at once.

    python benchmarks/api_load.py --url http://127.0.0.1:8000 [--api-key KEY] [--json PATH]
    python benchmarks/api_load.py            # self-contained: starts its own service (no Ray)

Against a running service (`make serve`, key from DLRM_API_KEY) the submissions
are real jobs: they are cancelled at the end unless --keep. Self-contained, the
service runs on a temporary sqlite database with no Ray cluster reachable, so
the jobs stay queued: that measures the API itself (HTTP, auth, database).
Prints the error count and p50/p99 latency of reads and writes; the target on
the 2-core development machine is zero errors and p99 under 200 ms for reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    args = ap.parse_args()

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


if __name__ == "__main__":
    sys.exit(main())
