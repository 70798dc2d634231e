"""Benchmark of archival memory: search latency and recall through the HNSW index, insert throughput.

Large sizes use SYNTHETIC embeddings (random unit vectors clustered around a few hundred centroids),
because embedding 100k texts with the real model on a small CPU takes far too long; the real model is
measured separately on a few thousand generated texts, through the same `ArchivalMemory` API agents use.

By default the benchmark starts its own embedded PostgreSQL in a temporary folder and removes it at the
end. With --database-url it uses that server instead and EMPTIES ITS archival_passages TABLE.

    python bench/archival_bench.py                      # 10k and 100k synthetic, 2,000 real texts
    python bench/archival_bench.py --sizes 2000 --queries 20 --real-texts 200   # a quick look
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from harness import ROOT, command_line, machine, new_data_dir, remove_data_dir
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb
from sqlalchemy.ext.compiler import compiles

from mas import db
from mas.config import Settings
from mas.memory.archival import (
    TAG_VOCABULARY,
    ArchivalMemory,
    NewPassage,
    ef_search_for,
    plan_search,
    search_statement,
)
from mas.models import EMBEDDING_DIM

INDEX_SQL = (
    "CREATE INDEX ix_archival_embedding_hnsw ON archival_passages "
    "USING hnsw (embedding vector_cosine_ops)"  # the definition of the migration: m=16, ef_construction=64
)
LIMIT = 10


class Explain(sa.sql.expression.Executable, sa.sql.expression.ClauseElement):
    """EXPLAIN of a SQLAlchemy statement, so the plan shown is that of the very query `search` runs."""

    inherit_cache = False

    def __init__(self, statement: sa.Select) -> None:
        self.statement = statement


@compiles(Explain)
def _compile_explain(element: Explain, compiler, **kw) -> str:
    return "EXPLAIN " + compiler.process(element.statement, **kw)


# --- synthetic data -------------------------------------------------------------------------------


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def clustered_vectors(rng: np.random.Generator, centroids: np.ndarray, n: int, spread: float) -> np.ndarray:
    """Unit vectors near random centroids; `spread` 0.7 gives cosine ~0.8 to the centroid, ~0.65 within
    a cluster, close to what MiniLM gives for texts on one topic."""
    picked = centroids[rng.integers(len(centroids), size=n)]
    noise = rng.normal(size=(n, EMBEDDING_DIM)) * spread / np.sqrt(EMBEDDING_DIM)
    return unit(picked + noise).astype(np.float32)


def random_tags(rng: np.random.Generator, n: int) -> list[list[str]]:
    """One or two tags per passage, drawn uniformly from the vocabulary."""
    counts = rng.integers(1, 3, size=n)
    return [list(rng.choice(TAG_VOCABULARY, size=k, replace=False)) for k in counts]


def copy_rows(engine: sa.Engine, vectors: np.ndarray, tags: list[list[str]], created: list[datetime]) -> None:
    """Bulk load with binary COPY, the fastest way into PostgreSQL."""
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        register_vector(conn)
        with conn.cursor() as cur, cur.copy(
            "COPY archival_passages (text, embedding, tags, metadata, created_at) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["text", "vector", "varchar[]", "jsonb", "timestamptz"])
            for i, (vector, tag_list, when) in enumerate(zip(vectors, tags, created)):
                copy.write_row((f"synthetic passage {i}", vector, tag_list, Jsonb({"synthetic": True}), when))
        conn.commit()
    finally:
        raw.close()


# --- measuring ------------------------------------------------------------------------------------


def percentiles_ms(seconds: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.array(seconds) * 1000, [50, 99])
    return float(p50), float(p99)


def plan_of(engine: sa.Engine, statement: sa.Select) -> str:
    """The plan's node lines, vector literals elided."""
    with engine.begin() as conn:
        lines = [row[0] for row in conn.execute(Explain(statement))]
    return "\n".join(re.sub(r"'\[[^\]]*\]'", "'[...]'", line) for line in lines)


@dataclass
class Searched:
    p50: float
    p99: float
    exact_p50: float
    exact_p99: float
    recall: float
    reruns: int  # queries whose first plan returned fewer than LIMIT rows, so search redid them exactly


def first_plan_ids(engine: sa.Engine, vector: list[float], *, tags: list[str] | None, ef: int) -> set[int]:
    """Ids the statement of `search` returns at this ef_search, without search's exact re-run."""
    with engine.begin() as conn:
        plan_search(conn, limit=LIMIT, ef_search=ef)
        return {row.id for row in conn.execute(search_statement(vector, tags=tags, limit=LIMIT))}


def measure_search(engine: sa.Engine, memory: ArchivalMemory, queries: np.ndarray, tags: list[str] | None) -> Searched:
    """Latency of `search_by_vector` as agents call it, and its recall@10 against an exact scan."""
    for q in queries[:5]:  # warm the caches and the connection pool
        memory.search_by_vector(q.tolist(), tags=tags, limit=LIMIT)
    approx_t, exact_t, recalls, reruns = [], [], [], 0
    for q in queries:
        vector = q.tolist()
        start = time.perf_counter()
        approx = memory.search_by_vector(vector, tags=tags, limit=LIMIT)
        approx_t.append(time.perf_counter() - start)
        start = time.perf_counter()
        exact = memory.search_by_vector(vector, tags=tags, limit=LIMIT, exact=True)
        exact_t.append(time.perf_counter() - start)
        truth = {r.id for r in exact}
        recalls.append(len(truth & {r.id for r in approx}) / max(1, len(truth)))
        reruns += len(first_plan_ids(engine, vector, tags=tags, ef=ef_search_for(LIMIT))) < LIMIT
    return Searched(*percentiles_ms(approx_t), *percentiles_ms(exact_t), float(np.mean(recalls)), reruns)


def ef_sweep(engine: sa.Engine, memory: ArchivalMemory, queries: np.ndarray, efs: list[int]) -> list[tuple]:
    """Recall and latency of the same statement at other hnsw.ef_search values, to judge the default."""
    truth = [{r.id for r in memory.search_by_vector(q.tolist(), limit=LIMIT, exact=True)} for q in queries]
    rows = []
    for ef in efs:
        times, recalls = [], []
        for q, expected in zip(queries, truth):
            start = time.perf_counter()
            got = first_plan_ids(engine, q.tolist(), tags=None, ef=ef)
            times.append(time.perf_counter() - start)
            recalls.append(len(got & expected) / LIMIT)
        rows.append((ef, *percentiles_ms(times), float(np.mean(recalls))))
    return rows


def reset_table(engine: sa.Engine, *, with_index: bool) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE archival_passages RESTART IDENTITY"))
        conn.execute(sa.text("DROP INDEX IF EXISTS ix_archival_embedding_hnsw"))
        if with_index:
            conn.execute(sa.text(INDEX_SQL))


def build_index(engine: sa.Engine) -> float:
    """Build the HNSW index; seconds taken. maintenance_work_mem is raised so the graph fits in memory."""
    start = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL maintenance_work_mem = '1GB'"))
        conn.execute(sa.text(INDEX_SQL))
        conn.execute(sa.text("ANALYZE archival_passages"))
    return time.perf_counter() - start


def load_note() -> str:
    """The machine may be shared: the 1-minute load average tells how much other work ran alongside."""
    return f"(1-minute load average when this section started: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"


def synthetic_run(engine, memory, n, *, rng, centroids, spread, queries, compare_index_on_load, out):
    print(f"\n== {n:,} synthetic passages", flush=True)
    note = load_note()
    vectors = clustered_vectors(rng, centroids, n, spread)
    tags = random_tags(rng, n)
    now = datetime.now(UTC)
    created = [now - timedelta(days=float(d)) for d in rng.uniform(0, 365, size=n)]

    if compare_index_on_load:
        reset_table(engine, with_index=True)
        start = time.perf_counter()
        copy_rows(engine, vectors, tags, created)
        indexed_load = time.perf_counter() - start
        print(f"COPY into the indexed table: {indexed_load:.1f}s", flush=True)

    reset_table(engine, with_index=False)
    start = time.perf_counter()
    copy_rows(engine, vectors, tags, created)
    load = time.perf_counter() - start
    build = build_index(engine)
    print(f"COPY {load:.1f}s, index build {build:.1f}s", flush=True)

    plans = {
        label: plan_of(engine, search_statement(queries[0].tolist(), tags=tags, limit=LIMIT))
        for label, tags in (("unfiltered", None), ("tags ⊇ {success}", ["success"]))
    }
    plain = measure_search(engine, memory, queries, None)
    print(f"search p50 {plain.p50:.1f} ms p99 {plain.p99:.1f} ms recall@10 {plain.recall:.3f}", flush=True)
    one_tag = measure_search(engine, memory, queries, ["success"])
    two_tags = measure_search(engine, memory, queries, ["success", "series"])
    sweep = ef_sweep(engine, memory, queries[:100], [40, 80, 200])
    with engine.begin() as conn:
        share_one = conn.execute(sa.text("select avg((tags @> '{success}')::int) from archival_passages")).scalar()
        share_two = conn.execute(
            sa.text("select avg((tags @> '{success,series}')::int) from archival_passages")
        ).scalar()
        sizes = conn.execute(
            sa.text("select pg_size_pretty(pg_table_size('archival_passages')), "
                    "pg_size_pretty(pg_relation_size('ix_archival_embedding_hnsw'))")
        ).one()

    out.append(f"\n### {n:,} passages (synthetic embeddings)\n\n{note}\n")
    out.append("| load | time | throughput |\n|---|---|---|")
    out.append(f"| binary COPY into the bare table | {load:.1f} s | {n / load:,.0f} rows/s |")
    out.append(f"| HNSW index build afterwards (m=16, ef_construction=64) | {build:.1f} s | |")
    out.append(f"| **bulk load total (COPY, then build)** | {load + build:.1f} s | {n / (load + build):,.0f} rows/s |")
    if compare_index_on_load:
        out.append(f"| binary COPY into a table whose HNSW index already exists | {indexed_load:.1f} s | "
                   f"{n / indexed_load:,.0f} rows/s |")
        out.append(f"\nBuilding the index after the bulk load is {indexed_load / (load + build):.0f}× faster than "
                   "loading into an indexed table, so larger sizes below are only loaded that way.")
    out.append(f"\nTable {sizes[0]}, HNSW index {sizes[1]}.\n")
    out.append(f"Search, top {LIMIT}, {len(queries)} queries through `ArchivalMemory.search_by_vector` (one "
               f"transaction each, `hnsw.ef_search`={ef_search_for(LIMIT)}); exact = the same query with index "
               "scans off, the ground truth of recall@10:\n")
    out.append("| filter | matching share | search p50 | search p99 | recall@10 | exact p50 | exact p99 | "
               "re-run exactly |\n|---|---|---|---|---|---|---|---|")
    for label, share, s in (("none", 1.0, plain), ("tags ⊇ {success}", share_one, one_tag),
                            ("tags ⊇ {success, series}", share_two, two_tags)):
        out.append(f"| {label} | {float(share):.1%} | {s.p50:.1f} ms | {s.p99:.1f} ms | {s.recall:.3f} | "
                   f"{s.exact_p50:.1f} ms | {s.exact_p99:.1f} ms | {s.reruns} |")
    out.append("\nRe-run exactly: queries whose first plan returned fewer than 10 passages (an HNSW scan keeps at "
               "most ef_search candidates before the tag filter), so `search` ran them again exactly; their "
               "time is in the search columns. Which plan serves a filtered query is the planner's choice; "
               "see the plans below.")
    out.append(f"\n`hnsw.ef_search` sweep (unfiltered, {len(queries[:100])} queries, statement run directly):\n")
    out.append("| ef_search | p50 | p99 | recall@10 |\n|---|---|---|---|")
    out.extend(f"| {ef} | {p50:.1f} ms | {p99:.1f} ms | {r:.3f} |" for ef, p50, p99, r in sweep)
    for label, plan in plans.items():
        out.append(f"\nPlan of a search, {label}:\n\n```\n{plan}\n```")


# --- real texts -----------------------------------------------------------------------------------

SUBJECTS = ["a red dragon", "an old fisherman", "a robot", "two kittens", "a lone astronaut", "a street dancer",
            "a wolf pack", "a violinist", "a paper boat", "a hot air balloon", "a knight", "a hummingbird",
            "a vintage car", "a chef", "a sleepy owl", "a skateboarder", "a lighthouse", "a jellyfish",
            "a samurai", "a child with a kite"]
ACTIONS = ["drifts slowly", "races", "dances", "waits patiently", "glides", "fights", "sleeps", "wanders",
           "explodes into light", "sings", "climbs", "hides"]
PLACES = ["through a neon city at night", "over a misty forest", "under a frozen lake", "across desert dunes",
          "inside a crowded market", "above the clouds", "in a flooded subway", "on a sunny beach",
          "through a snowy mountain pass", "in an abandoned factory", "along a coral reef", "in a candlelit hall"]
STYLES = ["in slow motion", "shot on 35mm film", "as a watercolor animation", "with a handheld camera",
          "in stop motion", "with dramatic backlight", "as a drone shot", "in black and white"]


def real_texts(rng: np.random.Generator, n: int) -> list[str]:
    """Distinct video-studio sentences, so the real model does real work on each."""
    seen: dict[str, None] = {}
    while len(seen) < n:
        text = " ".join(str(rng.choice(part)) for part in (SUBJECTS, ACTIONS, PLACES, STYLES)).capitalize() + "."
        seen[text] = None
    return list(seen)


def real_run(engine, memory, n, *, rng, out):
    print(f"\n== {n:,} real texts through the real model", flush=True)
    note = load_note()
    reset_table(engine, with_index=True)
    start = time.perf_counter()
    embedder = memory.embedder  # loads the model
    load_model = time.perf_counter() - start
    texts = real_texts(rng, 3 * n + 100)
    stored, embed_only, queries = texts[:n], texts[n:2 * n], texts[2 * n:2 * n + 100]

    start = time.perf_counter()
    for i in range(0, n, 100):  # 100 passages per insert_many: one embedding call, one transaction
        memory.insert_many(NewPassage(text=t, tags=["learning"], metadata={"i": i}) for t in stored[i:i + 100])
    end_to_end = time.perf_counter() - start

    start = time.perf_counter()
    embedder.embed(embed_only)
    embed = time.perf_counter() - start

    for q in queries[:5]:
        memory.search(q, limit=LIMIT)
    latencies = []
    for q in queries[5:]:
        start = time.perf_counter()
        memory.search(q, limit=LIMIT)
        latencies.append(time.perf_counter() - start)
    p50, p99 = percentiles_ms(latencies)
    start = time.perf_counter()
    for q in queries[5:]:
        memory.search(q, limit=LIMIT)
    cached = (time.perf_counter() - start) / len(queries[5:]) * 1000
    print(f"embed+insert {n / end_to_end:.0f}/s, embed only {n / embed:.0f}/s, search p50 {p50:.1f} ms", flush=True)

    out.append(f"\n### {n:,} real texts, real all-MiniLM-L6-v2 on CPU\n\n{note}\n")
    out.append(f"Generated studio sentences (e.g. \"{stored[0]}\"), stored with `ArchivalMemory.insert_many` in "
               "batches of 100 into a table with its HNSW index in place.\n")
    out.append("| step | time | throughput |\n|---|---|---|")
    out.append(f"| model load (once per process) | {load_model:.1f} s | |")
    out.append(f"| embed + insert (`insert_many`, end to end) | {end_to_end:.1f} s | "
               f"{n / end_to_end:,.0f} passages/s |")
    out.append(f"| embed only ({n:,} other texts, one `embed` call) | {embed:.1f} s | {n / embed:,.0f} texts/s |")
    out.append(f"\n`ArchivalMemory.search(text)` over these {n:,} passages, {len(latencies)} new query texts "
               f"(query embedding included): p50 {p50:.1f} ms, p99 {p99:.1f} ms; the same queries again, "
               f"embeddings now cached: {cached:.1f} ms on average.")


# --- main -----------------------------------------------------------------------------------------




def versions(engine: sa.Engine) -> str:
    with engine.begin() as conn:
        pg = conn.execute(sa.text("show server_version")).scalar()
        vec = conn.execute(sa.text("select extversion from pg_extension where extname='vector'")).scalar()
        shared = conn.execute(sa.text("show shared_buffers")).scalar()
        workers = conn.execute(sa.text("show max_parallel_maintenance_workers")).scalar()
    libs = ", ".join(f"{name} {version(name)}" for name in ("torch", "sentence-transformers", "SQLAlchemy", "psycopg"))
    return (f"PostgreSQL {pg} (shared_buffers {shared}, max_parallel_maintenance_workers {workers}), "
            f"pgvector {vec}; Python {platform.python_version()}, {libs}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000],
                        help="synthetic passage counts to measure (default: 10000 100000)")
    parser.add_argument("--queries", type=int, default=200, help="search queries per size (default: 200)")
    parser.add_argument("--real-texts", type=int, default=2000,
                        help="texts embedded with the real model and inserted (default: 2000; 0 skips)")
    parser.add_argument("--centroids", type=int, default=300, help="clusters of the synthetic vectors")
    parser.add_argument("--spread", type=float, default=0.7, help="noise around each centroid (default: 0.7)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--database-url", help="use this PostgreSQL (its archival_passages table is EMPTIED) "
                                               "instead of a temporary embedded one")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS-archival.md",
                        help="markdown report to write (default: bench/RESULTS-archival.md)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    command = command_line(__file__)
    data_dir = new_data_dir("mas-archival-bench-")
    settings = Settings(data_dir=data_dir, database_url=args.database_url)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    try:
        engine = db.find(settings)
        memory = ArchivalMemory(settings)
        centroids = unit(rng.normal(size=(args.centroids, EMBEDDING_DIM)))
        queries = clustered_vectors(rng, centroids, args.queries, args.spread)
        out = [
            "# Archival memory benchmark\n",
            f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            f"- command: `{command}`",
            f"- machine: {machine()}",
            "- load average (1/5/15 min) at start: {:.2f} / {:.2f} / {:.2f}; other work on the machine "
            "shows up in the tails (p99)".format(*os.getloadavg()),
            f"- software: {versions(engine)}",
            f"- database: {'given by --database-url' if args.database_url else 'embedded pgserver, temporary'}",
            "\n## Synthetic embeddings\n",
            (
                f"**These embeddings are SYNTHETIC**: random unit vectors around {args.centroids} random centroids "
                f"(noise {args.spread}), 1–2 random tags per passage from the studio vocabulary, created_at spread "
                "over a year; queries are fresh points drawn the same way. Real MiniLM embeddings of 100k texts "
                "would take too long on this CPU; recall on real text embeddings may differ."
            ),
        ]
        for i, n in enumerate(sorted(args.sizes)):
            synthetic_run(engine, memory, n, rng=rng, centroids=centroids, spread=args.spread, queries=queries,
                          compare_index_on_load=i == 0, out=out)
        if args.real_texts:
            out.append("\n## Real model")
            real_run(engine, memory, args.real_texts, rng=rng, out=out)
        out.append(f"\nTotal benchmark time: {(time.perf_counter() - started) / 60:.1f} min; load average at the "
                   "end: {:.2f} / {:.2f} / {:.2f}.".format(*os.getloadavg()))
        args.output.write_text("\n".join(out) + "\n")
        print(f"\nwrote {args.output}")
    finally:
        remove_data_dir(settings, data_dir)


if __name__ == "__main__":
    main()
