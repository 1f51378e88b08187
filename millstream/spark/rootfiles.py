"""The names of the files a pipeline root holds that more than one part of millstream reads: spelled
here once. Plain strings and no imports from millstream, so the console can name them without loading
Spark.

    pipeline.json                                the layout: computations, key groups, labels
                                                 (written first into every root: it marks a root)
    status/<computation>/latest.json             the status after the newest published batch
    status/<computation>/history/<batch>.json    one line of watermark history per batch
    status/<computation>/wake.json               the computation's next wall-time timer
    sinks/<sink>/<producer>.json                 how far a sink delivered a producer's output

>>> latest_status("windows")
'status/windows/latest.json'
>>> status_history("windows", 7)
'status/windows/history/000000000007.json'
"""

from __future__ import annotations

from typing import Any

LAYOUT_FILE = "pipeline.json"


def status_dir(computation: str) -> str:
    return f"status/{computation}"


def latest_status(computation: str) -> str:
    return f"{status_dir(computation)}/latest.json"


def history_dir(computation: str) -> str:
    return f"{status_dir(computation)}/history"


def status_history(computation: str, batch: int) -> str:
    return f"{history_dir(computation)}/{batch:012d}.json"


def sink_progress(sink: str, producer: str) -> str:
    return f"sinks/{sink}/{producer}.json"


def wake_file(computation: str) -> str:
    return f"{status_dir(computation)}/wake.json"


def read_status_history(storage: Any, computation: str) -> list[dict[str, Any]]:
    """The computation's history lines, oldest first. `storage`: a spark.storage.Storage at the root
    (passed in, so this module needs no import of it)."""
    history = storage.child(history_dir(computation))
    entries = (history.read_json(name) for name in sorted(history.list("")) if name.endswith(".json"))
    return [entry for entry in entries if entry]
