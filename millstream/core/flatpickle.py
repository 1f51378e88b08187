"""Pickling of millstream's own flat data (bundles, productions, state-store chunks) without pickle's memo.

Pickle remembers every object it writes, so that a second reference to it is written as a back
reference: one dict insertion per string, bytes and tuple. The data millstream pickles for itself is
made of fresh tuples, strings, bytes and ints with few shared objects and no cycles, where the memo
costs most of the time and saves a little space. `dumps` writes without it; `pickle.loads` reads the
result as usual.

>>> import pickle
>>> pickle.loads(dumps([("k", b"v", 1), ("k", b"w", 2)]))
[('k', b'v', 1), ('k', b'w', 2)]

Never for data with cycles: without a memo pickle cannot write them and raises an error.
"""

from __future__ import annotations

import io
import pickle
from typing import Any


def dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.fast = True  # no memo (see the module doc)
    pickler.dump(value)
    return buffer.getvalue()
