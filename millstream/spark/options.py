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
from typing import Any
from urllib.parse import urlsplit

from millstream.core.plan import check_whole

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


def check_runner_options(*, key_groups: Any, parallelism: Any, trigger_ms: Any, max_records_per_batch: Any,
                         retain_logs_s: Any) -> None:
    check_whole("key_groups", key_groups)
    check_whole("parallelism", parallelism, none="to follow the session")
    check_whole("trigger_ms", trigger_ms, 0, "a whole number of milliseconds")
    check_whole("max_records_per_batch", max_records_per_batch, none="for batch pacing")
    if retain_logs_s is not None and (isinstance(retain_logs_s, bool) or not isinstance(retain_logs_s, (int, float))
                                      or not retain_logs_s >= 0):
        raise (ValueError if isinstance(retain_logs_s, (int, float)) and not isinstance(retain_logs_s, bool)
               else TypeError)(f"retain_logs_s must be a number of seconds >= 0 (or None to keep every log), "
                               f"got {retain_logs_s!r}")
