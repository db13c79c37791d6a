"""Hostile input for the fuzz suite: bounded in size, so that every example ends quickly.

`make test` runs a few examples per property with a fixed seed (the same examples every run);
TANGRAM_FUZZ_EXAMPLES=N runs N per property from a random seed, to look further.
"""

from __future__ import annotations

import os
import string
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

_EXAMPLES = os.environ.get("TANGRAM_FUZZ_EXAMPLES")

# A longer search needs a longer per-test timeout than the suite's 120 s (a second per example).
TIMEOUT_S = 120 + (int(_EXAMPLES) if _EXAMPLES else 0)

FUZZ = settings(
    max_examples=int(_EXAMPLES) if _EXAMPLES else 12,
    derandomize=_EXAMPLES is None,
    database=None,
    # One example is a decode, a parse or a CEL compile: milliseconds. A deadline this far above
    # them catches a hang without failing on a loaded machine.
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Characters that break parsers: quotes, escapes, brackets, NUL, newlines, surrogates' neighbours.
_NASTY = "\"'\\[]{}()<>:/.,-_#&*!|>%@`~$\x00\n\r\t \u2028\ufeff\U0001f600é"
text = st.text(alphabet=st.sampled_from(string.printable + _NASTY), max_size=80) | st.text(max_size=40)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | text
)

json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=20,
)
# What a JSON encoder writes as valid JSON (no NaN or infinities).
valid_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=20,
)


def deep_json(depth: int) -> bytes:
    """JSON nested `depth` levels, objects and arrays in turn (built as text: json.dumps would recurse)."""
    opening = "".join('{"a":' if level % 2 == 0 else "[" for level in range(depth))
    closing = "".join("}" if level % 2 == 0 else "]" for level in reversed(range(depth)))
    return f"{opening}0{closing}".encode()


DEEP = "@@deep@@"  # a string value that `with_deep` swaps for deeply nested JSON
depths = st.integers(min_value=60, max_value=3000)
hostile_values = json_values | st.just(DEEP)


def with_deep(data: bytes, depth: int) -> bytes:
    return data.replace(f'"{DEEP}"'.encode(), deep_json(depth))
