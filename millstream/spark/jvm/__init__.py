"""millstream's JVM classes: Java sources shipped with the package, compiled on first use.

`LocalCheckpointFileManager` (see its source) writes Spark's checkpoint files on a local disk
without the processes Hadoop's local file system starts for each one. It needs a JDK's `javac`
once per machine (the jar is cached, keyed by the sources and the pyspark version); without one,
sessions keep Spark's default checkpoint file manager, which is correct, only slower.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile

CHECKPOINT_FILE_MANAGER = "millstream.spark.jvm.LocalCheckpointFileManager"
SOURCES = ("LocalCheckpointFileManager.java",)
# Spark 4 runs on Java 17 and later: classes for 17 load on all of them.
JAVA_RELEASE = "17"

log = logging.getLogger(__name__)


def cache_dir() -> str:
    return os.environ.get("MILLSTREAM_JVM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "millstream")


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def _spark_jars() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "jars")


def jar_path() -> str:
    """Where the jar of this package's sources for this pyspark is cached."""
    import pyspark

    digest = hashlib.sha256(pyspark.__version__.encode())
    for name in SOURCES:
        with open(os.path.join(os.path.dirname(__file__), name), "rb") as source:
            digest.update(source.read())
    return os.path.join(cache_dir(), f"millstream-jvm-{digest.hexdigest()[:16]}.jar")


def jar() -> str | None:
    """The jar of millstream's JVM classes, compiled now if it is not cached yet; None (logged) when
    no `javac` is found or compiling fails."""
    path = jar_path()
    if os.path.exists(path):
        return path
    javac = _javac()
    if javac is None:
        log.info("no javac found: Spark's default checkpoint file manager is used (slower on a local disk)")
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as scratch:
        classes = os.path.join(scratch, "classes")
        sources = [os.path.join(os.path.dirname(__file__), name) for name in SOURCES]
        done = subprocess.run([javac, "--release", JAVA_RELEASE, "-nowarn", "-d", classes,
                               "-cp", os.path.join(_spark_jars(), "*"), *sources],
                              capture_output=True, text=True)
        if done.returncode != 0:
            log.warning("compiling millstream's JVM classes failed; Spark's default checkpoint file manager is "
                        "used:\n%s", done.stderr[-2000:])
            return None
        built = os.path.join(scratch, "built.jar")
        with zipfile.ZipFile(built, "w") as archive:
            for folder, _, names in os.walk(classes):
                for name in sorted(names):
                    full = os.path.join(folder, name)
                    archive.write(full, os.path.relpath(full, classes))
        os.replace(built, path)  # atomic: sessions started side by side may both compile
    return path
