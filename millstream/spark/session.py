"""A SparkSession with the settings millstream needs, defaulting to an embedded local[*] Spark."""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any, Callable, Mapping, TypeVar

import millstream

T = TypeVar("T")

# What PySpark warns under pandas 3 wherever it checks pandas' version (transformWithState, every
# mapInArrow, some in Py4J's callback threads): millstream's tests run under pandas 3, and a user of
# the runner cannot act on it.
PANDAS_3_WARNING = "PySpark does not yet fully support pandas"


def hide_pandas_3_warning() -> None:
    """Leave PANDAS_3_WARNING out from now on: one filter for that message alone (added once:
    warnings.filterwarnings replaces an equal filter)."""
    warnings.filterwarnings("ignore", message=PANDAS_3_WARNING, category=FutureWarning)


STATE_STORE_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# Without C2 the JVM sizes its code cache for C1 alone (48 MB, against 240 MB with both tiers); a
# long-lived session (a week of batches, or the test suite's) filled it, and the JVM then failed with
# "Out of space in CodeCache for method handle intrinsic", stopping Spark. The usual size is kept.
_JIT_WITHOUT_C2 = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"

DEFAULT_CONF: dict[str, str] = {
    # transformWithState requires RocksDB; changelog checkpointing halves commit time.
    "spark.sql.streaming.stateStore.providerClass": STATE_STORE_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.shuffle.partitions": "2",
    # Spark's web UI (jobs, and a Structured Streaming tab with one entry per computation's named
    # query) is on; in local mode it listens on 127.0.0.1 only (create_session). Port 4040, or the
    # next free one: `spark.sparkContext.uiWebUrl`.
    "spark.ui.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.metricsEnabled": "false",
    "spark.driver.memory": "2g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # The JVMs' JIT without its optimizing tier (C2): millstream's JVMs mostly plan batches and move
    # bundles of bytes, and C2 kept compiling Spark's per-batch code run after run, costing more CPU
    # than it saved (docs/performance.md, "the JIT"). As *default* options, which Spark puts before
    # the extraJavaOptions of the user or the cluster's spark-defaults: those are kept, and a later
    # -XX:TieredStopAtLevel=4 there restores C2.
    "spark.driver.defaultJavaOptions": _JIT_WITHOUT_C2,
    "spark.executor.defaultJavaOptions": _JIT_WITHOUT_C2,
    # Python workers start slowly on a loaded 2-core machine; the default 15 s made them fail
    # with "Python worker failed to connect back".
    "spark.python.authenticate.socketTimeout": "120s",
}


REQUIRED_CONF = {"spark.sql.streaming.stateStore.providerClass": STATE_STORE_PROVIDER}

# Local mode: the driver, its block manager and its web UI listen on the
# loopback interface only, not on every interface of the machine. Spark's UI binds to SPARK_LOCAL_IP
# (else 0.0.0.0), read by the JVM when it starts.
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
LOCAL_ENV: dict[str, str] = {"SPARK_LOCAL_IP": "127.0.0.1"}


def session_settings(master: str, conf: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """(Spark settings, environment for the JVM) of a session millstream creates on `master`; the
    user's `conf` wins over millstream's defaults.

    >>> settings, env = session_settings("local[2]", {"spark.ui.enabled": "true"})
    >>> settings["spark.ui.enabled"], settings["spark.driver.bindAddress"], env
    ('true', '127.0.0.1', {'SPARK_LOCAL_IP': '127.0.0.1'})
    >>> settings["spark.driver.defaultJavaOptions"] == settings["spark.executor.defaultJavaOptions"]
    True
    >>> settings["spark.driver.defaultJavaOptions"]
    '-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m'
    >>> session_settings("spark://10.0.0.5:7077")[1]
    {}
    """
    local = master.startswith("local")
    settings = {**DEFAULT_CONF, **(LOCAL_CONF if local else {}), **dict(conf or {})}
    return settings, dict(LOCAL_ENV) if local else {}


CHECKPOINT_FILE_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"


def with_checkpoint_file_manager(settings: dict[str, str], env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """`settings` with millstream's checkpoint file manager (spark/jvm), unless the user chose one or
    no JDK can compile it: Hadoop's local file system starts processes for every checkpoint file
    (docs/performance.md, "tenth session"). Its jar goes to the driver and executors in `spark.jars`."""
    from millstream.spark import jvm

    if CHECKPOINT_FILE_MANAGER_KEY in settings:
        return settings, env
    jar = jvm.jar()
    if jar is None:
        return settings, env
    jars = ",".join(j for j in (settings.get("spark.jars"), jar) if j)
    return {**settings, "spark.jars": jars, CHECKPOINT_FILE_MANAGER_KEY: jvm.CHECKPOINT_FILE_MANAGER}, env


class SessionError(RuntimeError):
    """A user-supplied SparkSession lacks a setting millstream needs and it cannot be applied."""


def check_session(spark: Any) -> None:
    """Make a user's own session fit: apply what can still be set at run time, refuse clearly
    what cannot (transformWithState needs the RocksDB state store)."""
    for key, value in REQUIRED_CONF.items():
        current = spark.conf.get(key, None)
        if current == value:
            continue
        try:
            spark.conf.set(key, value)
        except Exception as error:
            raise SessionError(
                f"the SparkSession given to millstream has {key}={current!r}; millstream needs {value!r} "
                f"(transformWithState runs only on RocksDB). Create the session with "
                f".config({key!r}, {value!r}), or let millstream create it ({error})") from None


def cluster_parallelism(spark: Any, wait_s: float = 60.0, settle_s: float = 2.0,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> int:
    """The cores a new root's computations should run on: a cluster's executors register after the
    session starts, and until then Spark's default parallelism is 2, which a new root would keep.

    - local[N] and `spark.default.parallelism`: taken as they are;
    - dynamic allocation: its `maxExecutors` x `spark.executor.cores` when both are set (what the
      cluster can grow to), else the default, without waiting (no executor may come before a job);
    - otherwise it waits, at most `wait_s`, for the cores the session asks for
      (`spark.cores.max`, or `spark.executor.instances` x `spark.executor.cores`), or, when it asks
      for none, for the registered cores to hold still for `settle_s` once an executor is there.

    >>> class Context:  # two executors of 2 cores register on the fourth look
    ...     master, looks = "spark://10.0.0.5:7077", 0
    ...     def __init__(self, conf): self.conf = conf
    ...     def getConf(self): return self.conf
    ...     @property
    ...     def defaultParallelism(self):
    ...         self.looks += 1
    ...         return 4 if self.looks >= 4 else 2
    >>> class Session:
    ...     def __init__(self, **conf): self.sparkContext = Context(conf)
    >>> cluster_parallelism(Session(**{"spark.cores.max": "4"}), sleep=lambda s: None)
    4
    >>> cluster_parallelism(Session(**{"spark.executor.instances": "2", "spark.executor.cores": "2"}),
    ...                     sleep=lambda s: None)
    4
    >>> cluster_parallelism(Session(**{"spark.dynamicAllocation.enabled": "true",
    ...     "spark.dynamicAllocation.maxExecutors": "10", "spark.executor.cores": "4"}))
    40
    """
    context = spark.sparkContext
    conf = context.getConf()
    master = context.master
    if master == "local" or master.startswith("local[") or conf.get("spark.default.parallelism") is not None:
        return int(context.defaultParallelism)
    executor_cores = int(conf.get("spark.executor.cores") or 0)
    if (conf.get("spark.dynamicAllocation.enabled") or "").lower() == "true":
        most = int(conf.get("spark.dynamicAllocation.maxExecutors") or 0)
        return most * executor_cores if most and executor_cores else int(context.defaultParallelism)
    wanted = int(conf.get("spark.cores.max") or 0) or int(conf.get("spark.executor.instances") or 0) * executor_cores
    started = clock()
    cores, since = int(context.defaultParallelism), started
    while clock() - started < wait_s and not (wanted and cores >= wanted):
        sleep(0.25)
        now = int(context.defaultParallelism)
        if now != cores:
            cores, since = now, clock()
        elif not wanted and clock() - since >= settle_s and _executors(context) > 0:
            break
    return cores


def _executors(context: Any) -> int:
    """Executors registered with the driver (Spark lists the driver too)."""
    return len(context._jsc.sc().statusTracker().getExecutorInfos()) - 1


def _project_path() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(millstream.__file__)))


def create_session(master: str = "local[*]", app_name: str = "millstream",
                   conf: Mapping[str, str] | None = None, log_path: str | None = None):
    """Create (or reuse) the SparkSession. Python workers must import millstream: in local mode the
    package's folder is put on their PYTHONPATH; on a cluster, install millstream on the executors.

    With `log_path`, the JVM's own stdout and stderr (start-up warnings, and Python workers that
    print) go to that file instead of the user's terminal; failures still surface as exceptions."""
    from pyspark.sql import SparkSession

    path = _project_path()
    current = os.environ.get("PYTHONPATH", "")
    if path not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (path, current) if p)
    # Local Spark's Python workers run this very interpreter (a venv's python run without
    # activating the venv would otherwise start the system python3, without the user's packages).
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings, env = with_checkpoint_file_manager(*session_settings(master, conf))
    for key, value in env.items():
        os.environ.setdefault(key, value)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    spark = _with_jvm_output(log_path, builder.getOrCreate)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _with_jvm_output(log_path: str | None, start: Callable[[], T]) -> T:
    """The JVM inherits file descriptors 1 and 2 when it is spawned: point them at the log file
    for that moment only."""
    if log_path is None:
        return start()
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        return start()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)
