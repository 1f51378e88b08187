"""Command-line options checked before anything is touched, each failure one line and exit code 2.

Every millstream command (the demos, `millstream run`) parses with `OneLineArgumentParser` and the
value types below, then checks its directories and its Spark master here, before it deletes,
creates or starts anything: a finished run's data must never be lost to a typo in another option.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import warnings
from typing import NoReturn

EXIT_USAGE = 2
PROBE_TIMEOUT_S = 2.0


class UsageError(Exception):
    """A value refused before anything ran; the message is one line."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (no usage block) and exits with code 2.

    >>> OneLineArgumentParser(prog="demo").format_usage().startswith("usage: demo")
    True
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if kind is float and value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number > 0.

    >>> positive_int("3")
    3
    >>> positive_int("-5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be > 0, got -5
    """
    value = int(_number(text, int))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0.

    >>> non_negative_int("0")
    0
    """
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0.

    >>> positive_float("0.5")
    0.5
    >>> positive_float("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be > 0, got 0
    """
    value = float(_number(text, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


def check_writable_directory(path: str, option: str) -> str:
    """The absolute path of a directory this command may create or write, or UsageError. Tries to
    create (and removes) a probe directory in it, or in its nearest existing parent: permission
    bits do not say enough (root ignores them; /proc and read-only mounts refuse anyway).

    >>> import tempfile; base = tempfile.mkdtemp()
    >>> check_writable_directory(base + "/new/run", "--root") == base + "/new/run"
    True
    >>> check_writable_directory("/proc/nope", "--data-dir")
    Traceback (most recent call last):
    ...
    millstream.console.options.UsageError: --data-dir /proc/nope: cannot create a directory in /proc (No such file or directory)
    >>> check_writable_directory("", "--root")
    Traceback (most recent call last):
    ...
    millstream.console.options.UsageError: --root is empty; give a directory, e.g. --root ./millstream-data
    """
    if not path.strip():
        raise UsageError(f"{option} is empty; give a directory, e.g. {option} ./millstream-data")
    if _URL_SCHEME.match(path):
        raise UsageError(f"{option} {path}: a local directory is needed here (a remote root, such as s3://..., is "
                         "given to millstream.SparkRunner(root=...) in Python)")
    from millstream.spark.options import directory_problem

    absolute, problem = directory_problem(path)
    if problem is not None:
        raise UsageError(f"{option} {path}: {problem}")
    return absolute


_LOCAL = re.compile(r"^local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?$")
_STANDALONE = re.compile(r"^spark://(.+)$")
_PASSED_ON = ("yarn", "k8s://", "local-cluster[")


def standalone_addresses(master: str) -> list[tuple[str, int]]:
    """host:port pairs of a spark:// master (several for a high-availability master list).

    >>> standalone_addresses("spark://127.0.0.1:7077,node2:7078")
    [('127.0.0.1', 7077), ('node2', 7078)]
    """
    match = _STANDALONE.match(master)
    if match is None:
        return []
    addresses = []
    for part in match.group(1).split(","):
        host, _, port = part.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--master {master}: expected spark://host:port, e.g. spark://127.0.0.1:7077")
        addresses.append((host, int(port)))
    return addresses


def probe_tcp(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if something accepts TCP connections at host:port, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.timeout:
        return f"no answer within {timeout_s:g} s"
    except OSError as error:
        return error.strerror or str(error)


def check_master(master: str, probe: bool = True) -> None:
    """Refuse a master Spark would not understand, and a spark:// master nothing listens at (probed
    with a TCP connect, PROBE_TIMEOUT_S per address), before Spark is started.

    >>> check_master("local[2]"); check_master("local[*]"); check_master("yarn")
    >>> check_master("loacl[2]")
    Traceback (most recent call last):
    ...
    millstream.console.options.UsageError: --master loacl[2]: not a Spark master; use local[*], local[N] or spark://host:port
    """
    if _LOCAL.match(master) or master.startswith(_PASSED_ON):
        return
    addresses = standalone_addresses(master)
    if not addresses:
        raise UsageError(f"--master {master}: not a Spark master; use local[*], local[N] or spark://host:port")
    if not probe:
        return
    reasons = []
    for host, port in addresses:
        reason = probe_tcp(host, port)
        if reason is None:
            return
        reasons.append(f"{host}:{port}: {reason}")
    raise UsageError(f"cannot reach Spark master {master} ({'; '.join(reasons)}); is it running?")


def quiet_library_warnings() -> None:
    """Hide the FutureWarnings pyspark and pandas print for their own deprecations (e.g. "PySpark
    does not yet fully support pandas >= 3.0.0"): nothing a millstream user can act on."""
    for module in (r"pyspark(\..*)?", r"pandas(\..*)?"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
    from millstream.spark.session import hide_pandas_3_warning

    hide_pandas_3_warning()
