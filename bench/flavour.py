"""Row-based versus Pandas transformWithState for millstream's operator (issue: pick the flavour by
measuring). The Windower through SparkRunner, once with the operator as shipped (row-based
`transformWithState`) and once through `transformWithStateInPandas` with the same processor (input
bundles arrive as DataFrame rows, output rows leave as one DataFrame), same session, same input.
Bundled, an operator sees a few rows per shard per batch, so the flavour's per-row cost hardly counts."""

from __future__ import annotations

from typing import Any, Iterator

from bench.common import ProgressCollector, cli, expected_windows, spark_session
from bench.throughput import run_millstream
from millstream.spark.operator import OUTPUT_SCHEMA
from millstream.spark.runner import SparkRunner


class _PandasFlavour:
    """Adapts millstream's row processor to the Pandas API."""

    def __new__(cls, processor: Any) -> Any:
        import pandas as pd
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        class PandasProcessor(StatefulProcessor):
            def init(self, handle: Any) -> None:
                processor.init(handle)

            def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
                tuples = (row for frame in rows for row in frame.itertuples(index=False))
                out = [row.asDict() for row in processor.handleInputRows(key, tuples, timerValues)]
                if out:
                    yield pd.DataFrame(out)

            def close(self) -> None:
                processor.close()

        return PandasProcessor()


class PandasRunner(SparkRunner):
    def _stateful(self, rows: Any, processor: Any) -> Any:
        return rows.groupBy("shard").transformWithStateInPandas(_PandasFlavour(processor), OUTPUT_SCHEMA,
                                                                 "Update", "None")


def main(quick: bool) -> dict:
    """Per key count, runs in the order row, Pandas, Pandas, row (after one warm-up run of each), and
    the mean of each flavour: the first runs of a session are measurably slower, whatever runs them."""
    total = 60_000 if quick else 250_000
    spark = spark_session(log_name="flavour")
    collector = ProgressCollector(spark)
    for runner_class in (SparkRunner, PandasRunner):
        run_millstream(spark, collector, 1_000, 20_000, timeout=900, runner_class=runner_class, tag="warmup")
    rows = []
    for keys in (1_000, 10_000):
        expected = expected_windows(keys, total)
        rates: dict[str, list[float]] = {"row": [], "pandas": []}
        same = True
        for n, flavour in enumerate(("row", "pandas", "pandas", "row")):
            runner_class = PandasRunner if flavour == "pandas" else SparkRunner
            result = run_millstream(spark, collector, keys, total, timeout=900, runner_class=runner_class,
                                    tag=f"{flavour}{n}")
            same &= result.pop("_output") == expected
            rates[flavour].append(result["records_per_s"])
        row_rate, pandas_rate = (sum(rates[f]) / 2 for f in ("row", "pandas"))
        result = {"keys": keys, "records": total, "row_based_records_per_s": round(row_rate),
                  "pandas_records_per_s": round(pandas_rate), "runs": rates,
                  "pandas_over_row": round(pandas_rate / row_rate, 2), "identical_output": same}
        print(f"[flavour] {result}", flush=True)
        rows.append(result)
    collector.close(spark)
    return {"results": rows}


if __name__ == "__main__":
    cli("flavour", main)
