"""millstream's JVM classes (spark/jvm): compiled once per machine and cached, used by the sessions
millstream creates unless the user chose a checkpoint file manager, and left out, not failing, where
no JDK can compile them."""

import logging
import os
import zipfile

import pytest

from millstream.spark import jvm
from millstream.spark.session import CHECKPOINT_FILE_MANAGER_KEY, with_checkpoint_file_manager


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MILLSTREAM_JVM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_jar_is_compiled_once_and_then_reused(cache):
    if jvm._javac() is None:
        pytest.skip("no JDK (javac) on this machine")
    path = jvm.jar()
    assert path == jvm.jar_path() and os.path.dirname(path) == str(cache)
    with zipfile.ZipFile(path) as archive:
        assert "millstream/spark/jvm/LocalCheckpointFileManager.class" in archive.namelist()
    built = os.stat(path).st_mtime_ns
    assert jvm.jar() == path and os.stat(path).st_mtime_ns == built
    assert os.listdir(cache) == [os.path.basename(path)]  # no scratch left behind


def test_without_javac_there_is_no_jar_and_sessions_keep_sparks_manager(cache, monkeypatch, caplog):
    monkeypatch.setattr(jvm, "_javac", lambda: None)
    with caplog.at_level(logging.INFO, logger=jvm.__name__):
        assert jvm.jar() is None
    assert "no javac" in caplog.text
    settings = {"spark.ui.enabled": "true"}
    assert with_checkpoint_file_manager(settings, {}) == (settings, {})


def test_a_failed_compilation_is_reported_and_leaves_no_jar(cache, monkeypatch, caplog, tmp_path):
    broken = tmp_path / "javac"
    broken.write_text("#!/bin/sh\necho 'error: the compiler broke' >&2\nexit 2\n")
    broken.chmod(0o755)
    monkeypatch.setattr(jvm, "_javac", lambda: str(broken))
    with caplog.at_level(logging.WARNING, logger=jvm.__name__):
        assert jvm.jar() is None
    assert "the compiler broke" in caplog.text
    assert os.listdir(cache) == []


def test_sessions_get_the_manager_and_its_jar_beside_the_users_jars(monkeypatch):
    monkeypatch.setattr(jvm, "jar", lambda: "/cache/millstream-jvm.jar")
    settings, env = with_checkpoint_file_manager({"spark.jars": "/opt/user.jar"}, {"SPARK_LOCAL_IP": "127.0.0.1"})
    assert settings == {"spark.jars": "/opt/user.jar,/cache/millstream-jvm.jar",
                        CHECKPOINT_FILE_MANAGER_KEY: jvm.CHECKPOINT_FILE_MANAGER}
    assert env == {"SPARK_LOCAL_IP": "127.0.0.1"}


def test_a_manager_the_user_chose_is_kept(monkeypatch):
    monkeypatch.setattr(jvm, "jar", lambda: pytest.fail("no jar is needed"))
    chosen = {CHECKPOINT_FILE_MANAGER_KEY: "com.example.TheirManager"}
    assert with_checkpoint_file_manager(chosen, {}) == (chosen, {})
