"""The session millstream creates in local mode listens on 127.0.0.1 only (driver, block manager, and
the web UI when a user turns it on); a session the user brings gets the state store transformWithState
needs, or a clear refusal when it cannot be set."""

from types import SimpleNamespace

import pytest

from millstream.apps.dips import TrafficSpec, build_pipeline
from millstream.spark.runner import SparkRunner
from millstream.spark.session import STATE_STORE_PROVIDER, SessionError, check_session

PROVIDER = "spark.sql.streaming.stateStore.providerClass"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def test_local_spark_listens_on_loopback_only(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    # The web UI binds to SPARK_LOCAL_IP (else every interface): the JVM itself must have it.
    assert spark._jvm.java.lang.System.getenv("SPARK_LOCAL_IP") == "127.0.0.1"


def test_the_local_jvm_runs_without_the_optimizing_jit_tier(spark):
    """The default JVM options reach the JVM millstream starts (they must be given before it starts)."""
    arguments = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                     .getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in arguments
    assert spark.sparkContext.getConf().get("spark.executor.defaultJavaOptions").startswith("-XX:TieredStopAtLevel=1")
    # Its code cache keeps the size it has with both tiers: C1's alone (48 MB) filled in long sessions.
    jvm = spark.sparkContext._jvm
    hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert hotspot.getVMOption("ReservedCodeCacheSize").getValue() == str(240 * 1024 * 1024)


def test_a_users_session_gets_the_state_store_transform_with_state_needs(spark, tmp_path):
    spark.conf.set(PROVIDER, HDFS_PROVIDER)  # as a user's own session may be configured
    try:
        runner = SparkRunner(build_pipeline(TrafficSpec(events=100, keys=2)), root=str(tmp_path / "root"),
                             spark=spark)
        assert runner.spark is spark
        assert spark.conf.get(PROVIDER) == STATE_STORE_PROVIDER
    finally:
        spark.conf.set(PROVIDER, STATE_STORE_PROVIDER)


def test_a_session_that_cannot_take_the_setting_is_refused_clearly():
    class FrozenConf:
        def get(self, key, default=None):
            return HDFS_PROVIDER

        def set(self, key, value):
            raise RuntimeError("Cannot modify the value of a static config")

    with pytest.raises(SessionError, match="millstream needs .*RocksDBStateStoreProvider.*transformWithState"):
        check_session(SimpleNamespace(conf=FrozenConf()))
