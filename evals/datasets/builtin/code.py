"""Code tasks with unit tests: twelve function families × five parameters (seeded).

Each family has a reference implementation and a subtly wrong one (off by one, a missed
edge case). Test inputs are drawn per item and always include the edge the wrong version
gets wrong; expected values are computed from the reference when the suite is built, so
the tests are literal ``assert candidate(...) == value`` lines.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evals.datasets.builtin.common import BuiltinItem, make_item

SEED = 20262
PARAMS = (2, 3, 4, 5, 7)


@dataclass(frozen=True, slots=True)
class Family:
    entry: str
    signature: str
    task: str  # "{k}" is the parameter
    reference: str
    wrong: str
    inputs: Callable[[random.Random, int], list[tuple[Any, ...]]]


def _ints(r: random.Random, n: int, lo: int = -30, hi: int = 60) -> list[int]:
    return [r.randint(lo, hi) for _ in range(n)]


def _words(r: random.Random, n: int) -> str:
    vocab = ["red", "blue", "green", "apple", "stone", "river", "cloud", "sun", "tree", "bird"]
    return " ".join(r.choice(vocab[: r.randint(4, 10)]) for _ in range(n))


FAMILIES: tuple[Family, ...] = (
    Family("count_multiples", "count_multiples(nums: list[int]) -> int",
           "returns how many numbers in nums are multiples of {k} (0 counts as a multiple)",
           "def count_multiples(nums):\n    return sum(1 for x in nums if x % {k} == 0)\n",
           "def count_multiples(nums):\n    return sum(1 for x in nums if x % {k} == 0 and x != 0)\n",
           lambda r, k: [([0, *_ints(r, 8)],), ([],), ([k, -k, 0, 1],)]),
    Family("rotate_left", "rotate_left(xs: list[int]) -> list[int]",
           "returns xs rotated left by {k} positions (the rotation wraps around; an empty list stays empty)",
           "def rotate_left(xs):\n    if not xs:\n        return []\n    s = {k} % len(xs)\n    return xs[s:] + xs[:s]\n",
           "def rotate_left(xs):\n    if not xs:\n        return []\n    s = {k} % len(xs)\n    return xs[-s:] + xs[:-s]\n",
           lambda r, k: [(_ints(r, 9),), (_ints(r, max(1, k - 1)),), ([],), (_ints(r, k + 1),)]),
    Family("clamp_all", "clamp_all(xs: list[int]) -> list[int]",
           "returns xs with every value limited to the range [-{k}, {k}0]",
           "def clamp_all(xs):\n    return [min(max(x, -{k}), {k}0) for x in xs]\n",
           "def clamp_all(xs):\n    return [min(x, {k}0) for x in xs]\n",
           lambda r, k: [(_ints(r, 10, -100, 100),), ([-k - 1, k * 10 + 1, 0],), ([],)]),
    Family("fib_mod", "fib_mod(n: int) -> int",
           "returns the n-th Fibonacci number modulo {k}1, with fib(0) = 0 and fib(1) = 1",
           "def fib_mod(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {k}1\n    return a % {k}1\n",
           "def fib_mod(n):\n    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {k}1\n    return a % {k}1\n",
           lambda r, k: [(0,), (1,), (r.randint(5, 60),), (r.randint(100, 500),)]),
    Family("caesar", "caesar(s: str) -> str",
           "shifts every ASCII letter of s forward by {k} places in the alphabet, wrapping from z to a and "
           "keeping case; other characters are unchanged",
           "def caesar(s):\n    out = []\n    for c in s:\n        if c.islower() and c.isascii():\n"
           "            out.append(chr((ord(c) - 97 + {k}) % 26 + 97))\n        elif c.isupper() and c.isascii():\n"
           "            out.append(chr((ord(c) - 65 + {k}) % 26 + 65))\n        else:\n            out.append(c)\n"
           "    return ''.join(out)\n",
           "def caesar(s):\n    return ''.join(chr(ord(c) + {k}) if c.isalpha() else c for c in s)\n",
           lambda r, k: [("xyz ABC!",), ("".join(r.choice(string.ascii_letters + " .,") for _ in range(20)),), ("",)]),
    Family("digit_power_sum", "digit_power_sum(n: int) -> int",
           "returns the sum of the decimal digits of abs(n), each raised to the power {k}",
           "def digit_power_sum(n):\n    return sum(int(d) ** {k} for d in str(abs(n)))\n",
           "def digit_power_sum(n):\n    return sum(int(d) * {k} for d in str(abs(n)))\n",
           lambda r, k: [(r.randint(10, 10**6),), (-r.randint(10, 999),), (0,), (9,)]),
    Family("chunks", "chunks(xs: list[int]) -> list[list[int]]",
           "splits xs into consecutive lists of {k} elements; the last one may be shorter",
           "def chunks(xs):\n    return [xs[i:i + {k}] for i in range(0, len(xs), {k})]\n",
           "def chunks(xs):\n    return [xs[i:i + {k}] for i in range(0, len(xs) - {k} + 1, {k})]\n",
           lambda r, k: [(_ints(r, k * 3 + 1),), (_ints(r, k * 2),), ([],), (_ints(r, k - 1),)]),
    Family("run_length", "run_length(s: str) -> list[list]",
           "returns the run-length encoding of s as [character, count] pairs, runs of at most {k}0 characters "
           "(a longer run is split into several pairs)",
           "def run_length(s):\n    out = []\n    for c in s:\n        if out and out[-1][0] == c and out[-1][1] < {k}0:\n"
           "            out[-1][1] += 1\n        else:\n            out.append([c, 1])\n    return out\n",
           "def run_length(s):\n    out = []\n    for c in s:\n        if out and out[-1][0] == c:\n"
           "            out[-1][1] += 1\n        else:\n            out.append([c, 1])\n    return out\n",
           lambda r, k: [("aaabccdddd",), ("x" * (k * 10 + 3),), ("",), ("".join(r.choice("ab") for _ in range(15)),)]),
    Family("kth_largest", "kth_largest(xs: list[int]) -> int | None",
           "returns the {k}-th largest distinct value in xs, or None when xs has fewer than {k} distinct values",
           "def kth_largest(xs):\n    values = sorted(set(xs), reverse=True)\n    return values[{k} - 1] if len(values) >= {k} else None\n",
           "def kth_largest(xs):\n    values = sorted(xs, reverse=True)\n    return values[{k} - 1] if len(values) >= {k} else None\n",
           lambda r, k: [([9, 9, 8, 8, 7, 6, 5, 4, 3, 2, 1],), (_ints(r, 12, 0, 20),), ([1] * (k + 1),)]),
    Family("balanced", "balanced(s: str) -> bool",
           "returns True when the brackets ()[]{{}} in s are balanced and never nested deeper than {k} levels; "
           "other characters are ignored",
           "def balanced(s):\n    pairs = {{')': '(', ']': '[', '}}': '{{'}}\n    stack = []\n    for c in s:\n"
           "        if c in '([{{':\n            stack.append(c)\n            if len(stack) > {k}:\n                return False\n"
           "        elif c in pairs:\n            if not stack or stack.pop() != pairs[c]:\n                return False\n"
           "    return not stack\n",
           "def balanced(s):\n    pairs = {{')': '(', ']': '[', '}}': '{{'}}\n    stack = []\n    for c in s:\n"
           "        if c in '([{{':\n            stack.append(c)\n        elif c in pairs:\n"
           "            if not stack or stack.pop() != pairs[c]:\n                return False\n    return not stack\n",
           lambda r, k: [("(" * (k + 1) + ")" * (k + 1),), ("([]{x})",), ("(]",), ("(" * k + ")" * k,), ("",)]),
    Family("top_words", "top_words(text: str) -> list[str]",
           "returns the {k} most frequent lower-cased words of text (split on whitespace), most frequent first, "
           "ties in alphabetical order; fewer when there are fewer distinct words",
           "def top_words(text):\n    counts = {{}}\n    for w in text.lower().split():\n        counts[w] = counts.get(w, 0) + 1\n"
           "    return sorted(counts, key=lambda w: (-counts[w], w))[:{k}]\n",
           "def top_words(text):\n    counts = {{}}\n    for w in text.lower().split():\n        counts[w] = counts.get(w, 0) + 1\n"
           "    return sorted(counts, key=lambda w: -counts[w])[:{k}]\n",
           lambda r, k: [(_words(r, 30),), ("b a c B A d",), ("",), ("zeta yak xi wolf vole",)]),
    Family("merge_close", "merge_close(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]",
           "merges the (start, end) intervals, sorted by start, whose gap to the previous one is at most {k} "
           "(a gap of exactly {k} merges), and returns them as sorted tuples",
           "def merge_close(intervals):\n    out = []\n    for s, e in sorted(intervals):\n"
           "        if out and s - out[-1][1] <= {k}:\n            out[-1] = (out[-1][0], max(out[-1][1], e))\n"
           "        else:\n            out.append((s, e))\n    return out\n",
           "def merge_close(intervals):\n    out = []\n    for s, e in sorted(intervals):\n"
           "        if out and s - out[-1][1] < {k}:\n            out[-1] = (out[-1][0], max(out[-1][1], e))\n"
           "        else:\n            out.append((s, e))\n    return out\n",
           lambda r, k: [([(0, 2), (2 + k, 9), (30, 31)],), ([(5, 9), (1, 3)],), ([],),
                         ([(s, s + r.randint(0, 5)) for s in sorted(r.sample(range(100), 6))],)]),
)  # fmt: skip


def _run(source: str, entry: str, args: tuple[Any, ...]) -> Any:
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # the suite's own reference code, at build time
    return namespace[entry](*args)


def _fenced(source: str) -> str:
    return f"Here is the function.\n\n```python\n{source}```\n"


def items() -> list[BuiltinItem]:
    rng = random.Random(SEED)
    out: list[BuiltinItem] = []
    for fam in FAMILIES:
        for k in PARAMS:
            reference, wrong = fam.reference.format(k=k), fam.wrong.format(k=k)
            tests = []
            for args in fam.inputs(rng, k):
                expected = _run(reference, fam.entry, args)
                tests.append(f"assert candidate({', '.join(map(repr, args))}) == {expected!r}")
            prompt = (f"Write a Python function `{fam.signature}` that {fam.task.format(k=k)}. "
                      "Reply with the code in one ```python block.")  # fmt: skip
            scorer = {"type": "python_tests", "entry_point": fam.entry, "tests": tests}
            bad = (_fenced(wrong), _fenced(f"def {fam.entry}(*args):\n    return None\n"))
            out.append(make_item(f"code-{len(out) + 1:03d}", "code", prompt, scorer, _fenced(reference), bad,
                                 {"family": fam.entry, "k": k}))  # fmt: skip
    return out
