"""What Spark prints about millstream's sources: no plan, no root, no secret. The source plan
(injectors, the computation's plan, the root) travels inside the data source class Spark pickles when
it is registered; the one data source option is the computation's name. Checked on the query plan
(explain) and on every progress report (the sources' descriptions) of a pipeline run on an S3 root
(credentials from the environment) whose injector holds a secret.

A guard, not a reproduction: on Spark 4.3 neither these plan strings nor the progress print data source
options, so this test also passed with the former base64-pickled `plan` option (checked). What changed is
what the option holds; the check that no pickle is read from options is the code itself (source.py)."""

import json
import re
import uuid
from urllib.parse import urlsplit

from millstream.apps.dips import TrafficSpec, build_pipeline, expected_output
from millstream.spark.runner import SparkRunner
from millstream.spark.storage import Storage


def test_query_plans_and_progress_carry_no_plan_no_root_no_secret(spark, tmp_path, s3_server):
    spec = TrafficSpec(events=3_000, keys=4, seed=3)
    root = s3_server.location("run")
    bucket = urlsplit(root).netloc
    secret = f"sekrit-{uuid.uuid4().hex}"
    pipeline = build_pipeline(spec)
    injector = next(iter(pipeline.injectors.values())).injector
    object.__setattr__(injector, "api_token", secret)  # as a user's client credentials would travel
    runner = SparkRunner(pipeline, root=root, checkpoint_root=str(tmp_path / "checkpoints"), spark=spark,
                         max_records_per_batch=1_000)
    shown: list[str] = []

    def look(progress) -> None:  # type: ignore[no-untyped-def]
        for query in list(runner._queries.values()):
            # The plans as Spark holds them (explain() plans again, starting Python workers).
            last = query._jsq.streamingQuery().lastExecution()
            if last is not None:  # the plan of the latest batch, with the sources' relations and options
                shown.append(last.logical().toString())
            if query.lastProgress:
                shown.append(json.dumps(query.lastProgress, default=str))

    runner.run(on_progress=look, timeout=240)
    text = "\n".join(shown)
    assert "millstream_inputs" in text and '"sources"' in text, text[:2000]  # we did look at the sources
    assert secret not in text and bucket not in text and root not in text
    assert not re.search(r"[A-Za-z0-9+/=]{120,}", text), "an encoded blob in the plan"  # a pickled plan, base64
    assert not re.search(r"\bplan\b\s*[=:-]", text.replace("logical plan", "").replace("physical plan", "")
                         .replace("Logical Plan", "").replace("Physical Plan", ""))
    # The run itself is right, and what it wrote about itself holds no secret either.
    truth = expected_output(spec)
    rows = sorted((r.key, r.value["bucket"], r.value["count"]) for r in runner.read_stream("windows"))
    assert rows == truth["windows"]
    layout = json.dumps(Storage(root).read_json("pipeline.json"))
    assert secret not in layout
