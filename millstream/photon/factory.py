"""Open an IdRegistry from a URL: `sqlite:///path` (embedded) or `postgresql://...` (a server)."""

from __future__ import annotations

from typing import Any

from millstream.photon.registry import IdRegistry

_SQLITE = "sqlite:///"
_POSTGRES = ("postgresql://", "postgres://")


def open_registry(url: str, **options: Any) -> IdRegistry:
    """The registry at `url`; `options` go to the backend's constructor (e.g. initial_shards, namespace).

    `sqlite:///ids.db` is the file ids.db relative to the working directory, `sqlite:////tmp/ids.db` an
    absolute path. For PostgreSQL, give the password in the environment (PGPASSWORD, PGPASSFILE) or in
    the URL at run time; it never appears in a repr or an error message.

    >>> import tempfile, os
    >>> registry = open_registry("sqlite:///" + os.path.join(tempfile.mkdtemp(), "ids.db"), initial_shards=2)
    >>> type(registry).__name__, registry.sharding().max_shard_count
    ('SqliteRegistry', 2)
    >>> registry.close()
    """
    if url.startswith(_SQLITE):
        from millstream.photon.sqlite_registry import SqliteRegistry

        return SqliteRegistry(url[len(_SQLITE):], **options)
    if url.startswith(_POSTGRES):
        from millstream.photon.postgres_registry import PostgresRegistry

        return PostgresRegistry(url, **options)
    # Only the scheme is quoted: the rest of a URL may hold a password.
    scheme = url.split(":", 1)[0] if ":" in url else "(none)"
    raise ValueError(f"unsupported registry URL scheme {scheme!r}: use sqlite:///PATH or postgresql://...")
