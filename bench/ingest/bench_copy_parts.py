"""The batch's COPY text sent in parts vs whole: wall time of ``insert_interactions`` per batch.

No Kafka: N interaction events (the generator of ``bench_ingest.py``) are written through
``analytics.ingest.write.ingest_raw`` in batches on one connection, the batches alternating
between the text rendered and sent in parts of ``--part`` events and the whole batch's text
rendered first (one part), so load drifts hit both alike. Prints the median milliseconds of
``copy_text.insert_interactions`` (the COPY of ``interactions`` and ``lg_fold``, the C
renderer, the first-turn lookup) per batch for each.

    .venv/bin/python bench/ingest/bench_copy_parts.py --events 800000 --batch 50000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from bench_ingest import add_write_args, make_events, scratch_database

from analytics.ingest import copy_text, samples, write
from contracts.events import encode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_write_args(ap)
    ap.add_argument("--part", type=int, default=copy_text.RENDER_PART)
    ap.add_argument("--parts-first", action="store_true", help="the first batch in parts (else whole)")
    a = ap.parse_args()
    events = make_events(a.events, a.units)
    raws = [write.Raw(encode(e), "bench", 0, i, e.key, e) for i, e in enumerate(events)]
    insert = copy_text.insert_interactions
    times: dict[str, list[float]] = {"parts": [], "whole": []}
    mode = ["parts"]

    def timed(*args: Any, **kw: Any) -> copy_text.Inserted:
        t = time.perf_counter()
        out = insert(*args, **kw, part=a.part if mode[0] == "parts" else len(raws) + 1)
        times[mode[0]].append(time.perf_counter() - t)
        return out

    copy_text.insert_interactions = timed  # type: ignore[assignment]  # the bench's probe (write.py calls it through the module)
    with scratch_database(a.admin_url, "lg_bench_parts") as url, psycopg.connect(url) as pg:
        cuts, conversations = samples.SampleCuts(), copy_text.CountedConversations()
        for n, i in enumerate(range(0, len(raws), a.batch)):
            mode[0] = "parts" if (n % 2 == 0) == a.parts_first else "whole"
            write.ingest_raw(pg, raws[i : i + a.batch], (), cuts=cuts, conversations=conversations)
    for name, ts in times.items():
        ms = [round(t * 1000) for t in ts]
        print(f"{name}: median {statistics.median(ts) * 1000:,.1f} ms per batch of {a.batch:,} {ms}")
    print(f"parts / whole: {statistics.median(times['parts']) / statistics.median(times['whole']):.2f}")


if __name__ == "__main__":
    main()
