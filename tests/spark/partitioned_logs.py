"""What the tests of partitioned reads share: search logs written as files, and the number of tasks of
each stage a Spark session ran."""

import json
import os
import urllib.request


def write_search_logs(directory, files, records, keys, file_span_ms):
    """Files part-000 ... of `records` searches each over `keys` keys, file n starting at 10 s +
    n * file_span_ms, each file's mtime its first record's time; the (key, timestamp) they hold."""
    points = []
    for n in range(files):
        start = 10_000 + n * file_span_ms
        path = os.path.join(directory, f"part-{n:03d}.jsonl")
        with open(path, "w") as out:
            for i in range(records):
                key, timestamp = f"q{(n + i) % keys}", start + i * 50
                out.write(json.dumps({"key": key, "value": {"i": i}, "timestamp": timestamp}) + "\n")
                points.append((key, timestamp))
        os.utime(path, ns=(start * 1_000_000, start * 1_000_000))  # created at its first record
    return points


def read_stage_tasks(spark):
    """{stage id: its number of tasks} of every source read the session ran (its UI's REST API): a
    completed stage that read no shuffle. The stateful operators' stages read the source's shuffle."""
    context = spark.sparkContext
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/stages?status=complete"
    with urllib.request.urlopen(url, timeout=30) as response:
        return {stage["stageId"]: stage["numTasks"] for stage in json.load(response)
                if stage["shuffleReadBytes"] == 0 and stage["shuffleWriteBytes"] > 0}
