"""CPU per request of the task-category step (``gateway.category``), in isolation.

The end-to-end harness cannot resolve a few µs on a shared box, so this times
``CategoryRules.categorize`` on parsed requests of the shapes the hot path sees, with the
built-in rules: a short coding prompt (first rule matches), a short chit-chat prompt (no
rule matches: every rule scans the text, the worst case per character), a 50 kB prompt
(rules see its first 512 characters only), a client ``task`` tag (no scan), and the
judge sampler's per-request draw (``rng() < rate``). Rounds are interleaved; medians in µs.

  python -m bench.gateway.category_bench [--calls 20000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from gateway.category import default_rules


def _chat(text: str) -> dict[str, object]:
    return {
        "model": "fake",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rules = default_rules()
    rng = random.random
    long_text = ("Please look at this report and tell me what you think about the tone. " * 800)[:50_000]
    cases: dict[str, Callable[[], object]] = {
        "code prompt (first rule)": lambda r=_chat("Write a Python function that merges two lists."): (
            rules.categorize(r, "chat", {})
        ),
        "chat prompt (no rule matches)": lambda r=_chat("Can you suggest a name for a team that ranks orders?"): (
            rules.categorize(r, "chat", {})
        ),
        "50 kB prompt (no match)": lambda r=_chat(long_text): rules.categorize(r, "chat", {}),
        "task tag": lambda r=_chat("anything"): rules.categorize(r, "chat", {"task": "code"}),
        "judge draw (rng < rate)": lambda: rng() < 0.05,
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t0 = time.process_time()
            for _ in range(args.calls):
                fn()
            samples[name].append((time.process_time() - t0) / args.calls * 1e6)
    print(f"{'case':34} {'median µs':>10} {'min µs':>8}")
    for name, values in samples.items():
        print(f"{name:34} {statistics.median(values):10.2f} {min(values):8.2f}")


if __name__ == "__main__":
    main()
