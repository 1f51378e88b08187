"""SparkRunner's options, checked before anything is written or Spark starts: a mistake gets one
error naming the option, what was given and what is expected, not a stack trace from deep inside
Spark or pyarrow later.

>>> check_root("s3://bucket/run")
's3://bucket/run'
>>> check_root("")
Traceback (most recent call last):
...
ValueError: root is empty; give a directory, e.g. root='./millstream-data'
"""

from __future__ import annotations

import os
import tempfile
from typing import Any
from urllib.parse import urlsplit

from millstream.core.plan import check_whole
from millstream.model.pipeline import PipelineError

# Schemes a root may have (storage.py): local paths, file://, and the remote filesystems pyarrow opens.
ROOT_SCHEMES = ("", "file", "s3", "s3a", "gs", "hdfs")


def check_root(root: Any, name: str = "root", any_scheme: bool = False) -> str:
    """The root as a string: a non-empty path or location, with a scheme millstream can open unless
    `any_scheme` (Spark's checkpoints go wherever its Hadoop connectors reach)."""
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path or a location such as s3://bucket/dir, got {root!r}")
    text = os.fspath(root)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{name} is empty; give a directory, e.g. {name}='./millstream-data'")
    scheme = urlsplit(text).scheme
    if not any_scheme and len(scheme) > 1 and scheme.lower() not in ROOT_SCHEMES:  # one letter: a Windows drive
        raise ValueError(f"{name} {text!r}: unknown scheme {scheme!r}; give a local directory or a location on "
                         "s3://, gs:// or hdfs://")
    return text


def directory_problem(path: str) -> tuple[str, str | None]:
    """(the absolute path, what keeps this process from creating or writing a directory there, or
    None). Tries to create (and removes) a probe directory in it, or in its nearest existing parent:
    permission bits do not say enough (root ignores them; /proc and read-only mounts refuse anyway).

    >>> directory_problem("/proc/nope")
    ('/proc/nope', 'cannot create a directory in /proc (No such file or directory)')
    """
    absolute = os.path.abspath(os.path.expanduser(path))
    existing = absolute
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == absolute else f"is under {existing}, which is a file"
        return absolute, f"{where}, not a directory"
    try:
        probe = tempfile.mkdtemp(prefix=".millstream-probe-", dir=existing)
    except OSError as error:
        action = "cannot write in" if existing == absolute else "cannot create a directory in"
        return absolute, f"{action} {existing} ({error.strerror or error})"
    os.rmdir(probe)
    return absolute, None


def check_sink_directory(path: str, sink: str) -> None:
    """Refuse a local file sink's directory this process cannot create or write: the driver moves
    each batch's files into it, and found out only at the first delivery, after a batch had run.

    >>> check_sink_directory("/proc/out", "s")
    Traceback (most recent call last):
    ...
    millstream.model.pipeline.PipelineError: sink 's': /proc/out: cannot create a directory in /proc (No such file or directory)
    """
    _, problem = directory_problem(path)
    if problem is not None:
        raise PipelineError(f"sink {sink!r}: {path}: {problem}")


def check_runner_options(*, key_groups: Any, parallelism: Any, trigger_ms: Any, max_records_per_batch: Any,
                         retain_logs_s: Any) -> None:
    check_whole("key_groups", key_groups, none="for the root's own")
    check_whole("parallelism", parallelism, none="to follow the session")
    check_whole("trigger_ms", trigger_ms, 0, "a whole number of milliseconds")
    check_whole("max_records_per_batch", max_records_per_batch, none="for batch pacing")
    if retain_logs_s is not None and (isinstance(retain_logs_s, bool) or not isinstance(retain_logs_s, (int, float))
                                      or not retain_logs_s >= 0):
        raise (ValueError if isinstance(retain_logs_s, (int, float)) and not isinstance(retain_logs_s, bool)
               else TypeError)(f"retain_logs_s must be a number of seconds >= 0 (or None to keep every log), "
                               f"got {retain_logs_s!r}")
