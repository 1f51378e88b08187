"""Keeping the registry's password out of everything that is pickled, logged or printed.

A dispatcher travels to Spark's Python workers pickled inside Spark's plan, so the registry URL it
carries must hold no password. libpq reads one from the environment (PGPASSWORD) or a password file
(PGPASSFILE), and Spark's local workers inherit the driver's environment: the driver moves a password
given in the URL there before Spark starts. (On a cluster, give the executors a PGPASSFILE, or
`spark.executorEnv.PGPASSWORD`, which Spark's UI shows: prefer the file.)
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit, urlunsplit


def has_password(url: str) -> bool:
    """Whether a URL carries a password.

    >>> has_password("postgresql://photon:s3cret@db:5432/ids"), has_password("postgresql://photon@db/ids")
    (True, False)
    >>> has_password("sqlite:////tmp/ids.db")
    False
    """
    if not url.startswith(("postgresql://", "postgres://")):
        return False
    return urlsplit(url).password is not None


def without_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password or None).

    >>> without_password("postgresql://photon:s%40cret@db:5432/ids")
    ('postgresql://photon@db:5432/ids', 's@cret')
    """
    if not has_password(url):
        return url, None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address goes back in brackets
        host = f"[{host}]"
    netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), unquote(parts.password or "")


def move_password_to_environment(url: str) -> str:
    """The URL without its password; the password, if any, goes to PGPASSWORD of this process (and so
    of the Spark workers it starts).

    >>> import os
    >>> move_password_to_environment("postgresql://photon:s3cret@db/ids"), os.environ.pop("PGPASSWORD")
    ('postgresql://photon@db/ids', 's3cret')
    """
    bare, password = without_password(url)
    if password is not None:
        os.environ["PGPASSWORD"] = password
    return bare
