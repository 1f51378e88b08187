"""Where a path, location or table name given by the user points: one reading for every layer (the
Spark runner's storage opens it, the pipeline compares sinks' places with it).

A location is local when it has no scheme, a `file:` scheme, or a one-letter scheme (a Windows
drive). A local one is the absolute path of its path part; `~` is not expanded (the shell does that
for the command line; Python code gets what it gives). A remote one keeps its scheme, `s3a` and
`s3n` read as `s3` (one bucket, however Hadoop names the connector).
"""

from __future__ import annotations

import os
import re
import tempfile
from urllib.parse import urlsplit


def is_local(location: str) -> bool:
    """
    >>> is_local("./out"), is_local("file:///tmp/out"), is_local("s3://bucket/out")
    (True, True, False)
    """
    scheme = urlsplit(location).scheme
    return scheme in ("", "file") or len(scheme) == 1


def local_path(location: str) -> str:
    """The absolute path a local location names.

    >>> local_path("file:///tmp/out") == local_path("/tmp/out/") == "/tmp/out"
    True
    """
    return os.path.abspath(urlsplit(location).path if location.startswith("file:") else location)


def place(location: str) -> str:
    """One spelling per place: two locations naming the same directory give the same text.

    >>> place("file:/tmp/out") == place("/tmp/x/../out") == "/tmp/out"
    True
    >>> place("s3a://bucket/out/") == place("s3://bucket/out")
    True
    """
    if is_local(location):
        return local_path(location)
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    scheme = "s3" if scheme in ("s3a", "s3n") else scheme
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def table_place(table: str) -> str:
    """One spelling per Spark table: names ignore case and quotes, the default database is implied.

    >>> table_place("`Default`.EVENTS") == table_place("spark_catalog.default.events") == "events"
    True
    """
    parts = [part.strip("`").lower() for part in table.split(".")]
    if parts[0] == "spark_catalog":
        parts = parts[1:]
    if len(parts) == 2 and parts[0] == "default":
        parts = parts[1:]
    return ".".join(parts)


def temporary_log_dir(pipeline_name: str) -> str:
    """Where a run of the pipeline keeps its logs when it has no local root to keep them in (a remote
    root, the harness): a directory of its own under the system's temporary directory.

    >>> temporary_log_dir("clicks/v2").endswith(os.path.join("millstream-logs", "clicks_v2"))
    True
    """
    return os.path.join(tempfile.gettempdir(), "millstream-logs", re.sub(r"[^\w.-]", "_", pipeline_name))
