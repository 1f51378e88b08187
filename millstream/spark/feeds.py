"""Inputs Spark itself produces: each DataFrameInjector's staging query (injectors/dataframe.py has
the protocol) starts and stops with the pipeline's queries, resumes from its own checkpoint
(`<checkpoint_root>/inputs/<injector>`), and, for a bounded DataFrame, marks the input ended once
Spark has read all of it."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from millstream.injectors.dataframe import DataFrameInjector
from millstream.model.pipeline import Pipeline, PipelineError
from millstream.spark import faults
from millstream.spark.errors import MillstreamRunError, restart_after, user_error_message
from millstream.spark.storage import Storage



def _staging(injector: DataFrameInjector, name: str) -> Any:
    def stage(batch_df: Any, batch_id: int) -> None:
        injector.stage_batch(batch_df, batch_id)
        faults.reached("input-staged", name)
    return stage


class Feeds:
    """The staging queries of a pipeline's DataFrame injectors."""

    def __init__(self, pipeline: Pipeline, storage: Storage, checkpoint_root: str, trigger_ms: int) -> None:
        self.injectors = {name: node.injector for name, node in pipeline.injectors.items()
                          if isinstance(node.injector, DataFrameInjector)}
        for name, injector in self.injectors.items():
            if injector.df is None:
                raise PipelineError(f"DataFrameInjector {name!r} has no DataFrame (it was unpickled?)")
            injector.stage_to(storage.child(f"inputs/{name}"))
        self.checkpoint_root = checkpoint_root
        self.trigger_ms = trigger_ms
        self._queries: dict[str, Any] = {}
        self._restarts: dict[str, int] = {}
        self._stopping = False
        self._staging: set[str] = set()  # bounded injectors this run has not yet read to their end
        self._notes: list[str] = []

    def start(self, pipeline_name: str) -> None:
        self._stopping = False
        self._staging = {name for name, injector in self.injectors.items() if injector.bounded}
        for name in self.injectors:
            self._queries[name] = self._start(pipeline_name, name)

    def _start(self, pipeline_name: str, name: str) -> Any:
        injector = self.injectors[name]
        if injector.df.sparkSession.sparkContext._jsc is None:
            raise PipelineError(f"the DataFrame of injector {name!r} belongs to a stopped Spark session; build it "
                                "on the runner's session (SparkRunner(spark=...) or runner.spark)")
        writer = (injector.df.writeStream.queryName(f"{pipeline_name}.input.{name}")
                  .foreachBatch(_staging(injector, name))
                  .option("checkpointLocation", Storage(self.checkpoint_root).child(f"inputs/{name}").location))
        if injector.bounded:
            query = writer.trigger(availableNow=True).start()
            threading.Thread(target=self._mark_ended_when_read, args=(name, query), daemon=True,
                             name=f"millstream-input-{name}").start()
        else:
            query = writer.trigger(processingTime=f"{self.trigger_ms} milliseconds").start()
        return query

    def _mark_ended_when_read(self, name: str, query: Any) -> None:
        try:
            query.awaitTermination()
        except Exception:
            return  # raise_if_failed reports it
        if not self._stopping and query.exception() is None:
            late = self.injectors[name].mark_ended()
            if late:
                self._notes.append(
                    f"input {name!r} was read to its end by an earlier run on this root (bounded=True: its "
                    f"watermark is END_OF_TIME); {late} row(s) arrived since and are delivered late. For an input "
                    "that grows between runs, use bounded=False with max_out_of_orderness_ms")
            self._staging.discard(name)

    def take_notes(self) -> list[str]:
        """What users should hear of this run's inputs, once."""
        notes, self._notes = self._notes, []
        return notes

    def staged_to_the_end(self) -> bool:
        """This run has staged every bounded DataFrame to its end (a run is not over before)."""
        return not self._staging

    def raise_if_failed(self, pipeline_name: str, log_dir: str) -> None:
        for name, query in list(self._queries.items()):
            error = query.exception()
            if error is None:
                continue
            delay = restart_after(error, self._restarts.get(name, 0))
            if delay is not None:
                self._restarts[name] = self._restarts.get(name, 0) + 1
                time.sleep(delay)
                self._queries[name] = self._start(pipeline_name, name)
                continue
            os.makedirs(log_dir, exist_ok=True)
            with open(os.path.join(log_dir, "errors.log"), "a") as log:
                log.write(f"--- input {name!r} failed at {time.ctime()}\n{error}\n")
            raise MillstreamRunError(f"input {name!r} failed: {user_error_message(str(error))}\n"
                                     f"(full trace in {os.path.join(log_dir, 'errors.log')})")

    def stop(self) -> None:
        self._stopping = True
        for query in self._queries.values():
            try:
                query.stop()
            except Exception:  # stopping a failed query can raise again; it is stopped either way
                pass
        self._queries.clear()
