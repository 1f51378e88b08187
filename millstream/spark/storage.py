"""Where the Spark runner keeps its files: a local directory or any filesystem pyarrow reaches.

A location is a local path or a URI pyarrow.fs understands: `s3://bucket/prefix` (options such as
`?endpoint_override=host:port&scheme=http&region=...` in the query), `gs://...`, `hdfs://...` (needs
libhdfs). `s3a://` is read as `s3://`, so the same location can be given to Spark's Hadoop connectors.
Every process that touches the location (driver, source planner, executors) opens it from the same
string, so a root travels to executors as text.

Writes are atomic: a local file is written aside and renamed into place; an object store makes an
object visible only once its upload completes. Readers therefore see a file whole or not at all. Not
every store replaces an existing object atomically, though (the S3 test server was seen serving a
half-written replacement of a computation's status): a JSON file that does not parse is read again.

`create` writes a file only if it does not exist yet, atomically: exactly one of several writers racing
for a name wins (local disk: a hard link of a finished temp file, which fails if the name exists; S3:
a conditional put with `If-None-Match: *`). The fenced publication log is built on it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import shutil
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from millstream.model.locations import is_local, local_path


_JSON_READ_ATTEMPTS = 20


# Query options of a location that carry secrets (pyarrow's S3 and GCS options, signed URLs, the usual
# names). A location is written to pipeline.json, logs, messages and Spark's query plans: it must not
# carry credentials, which come from the environment or the storage's own credential chain instead.
_SECRET_OPTIONS = frozenset({
    "access_key", "secret_key", "session_token", "access_token", "credentials", "password", "passwd",
    "secret", "token", "sig", "signature", "awsaccesskeyid", "x-amz-credential", "x-amz-signature",
    "x-amz-security-token", "x-goog-credential", "x-goog-signature", "key", "apikey", "api_key",
})


class CredentialsInLocation(ValueError):
    """A location (URI) with credentials in it; they must come from the environment instead."""


def _options(query: str) -> list[tuple[str, str]]:
    return [(name, value) for name, _, value in (item.partition("=") for item in query.split("&") if item)]


def _split_userinfo(location: str) -> tuple[str, bool]:
    """(the location without user information, whether it had any). Any '@' before the query counts:
    a secret may hold '/' or '+', which ends a URI's authority early for urlsplit."""
    scheme, sep, rest = location.partition("://")
    before_query, q, query = rest.partition("?")
    if not sep or "@" not in before_query:
        return location, False
    return f"{scheme}://{before_query.rsplit('@', 1)[1]}{q}{query}", True


def redact_location(location: str) -> str:
    """The location without user information and without the values of secret query options.

    >>> redact_location("s3://AKIA123:wJa/lr+x@bucket/root?region=eu-west-1&secret_key=wJa/lr")
    's3://bucket/root?region=eu-west-1&secret_key=***'
    """
    if is_local(location):
        return location
    location, _ = _split_userinfo(location)
    parts = urlsplit(location)
    query = "&".join(f"{name}=***" if name.lower() in _SECRET_OPTIONS else f"{name}={value}"
                     for name, value in _options(parts.query))
    return urlunsplit(parts._replace(query=query))


def check_no_credentials(location: str, what: str = "location") -> None:
    """Refuse a location that carries credentials (user:password@ or a secret query option), with
    a message that does not repeat them.

    >>> check_no_credentials("s3://bucket/root?endpoint_override=127.0.0.1:9000&scheme=http")
    >>> check_no_credentials("s3://AKIA123:wJa/lr@bucket/root", "root")
    Traceback (most recent call last):
    ...
    millstream.spark.storage.CredentialsInLocation: root s3://bucket/root carries credentials (user:password@); give them through the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance role) or the storage's own credential chain, never in the URI: it is written to pipeline.json, logs and Spark's query plans
    """
    if is_local(location):
        return
    without, userinfo = _split_userinfo(location)
    found = ["user:password@"] if userinfo else []
    found += [f"option {name}" for name, _ in _options(urlsplit(without).query) if name.lower() in _SECRET_OPTIONS]
    if found:
        raise CredentialsInLocation(
            f"{what} {redact_location(location).split('?')[0]} carries credentials ({', '.join(found)}); give "
            "them through the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance "
            "role) or the storage's own credential chain, never in the URI: it is written to pipeline.json, "
            "logs and Spark's query plans")


class CreateNotSupported(RuntimeError):
    """The location's filesystem cannot create a file only-if-absent atomically."""


class Storage:
    """Files under one location. Paths given to methods are relative to it, '/'-separated."""

    def __init__(self, location: str) -> None:
        self.location = location
        if is_local(location):
            self.fs: pafs.FileSystem = pafs.LocalFileSystem()
            self.base = local_path(location)
            self.local = True
        else:
            check_no_credentials(location)
            parts = urlsplit(location)
            if parts.scheme == "s3a":
                parts = parts._replace(scheme="s3")
            self.fs, self.base = pafs.FileSystem.from_uri(urlunsplit(parts))
            self.base = self.base.rstrip("/")
            self.local = False

    def __getstate__(self) -> dict[str, Any]:  # filesystems do not pickle everywhere: reopen by name
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"])  # type: ignore[misc]

    def describe(self, path: str = "") -> str:
        """The path as a user would type it, for messages."""
        if self.local:
            return os.path.join(self.base, *path.split("/")) if path else self.base
        parts = urlsplit(self.location)
        host = parts.netloc.rsplit("@", 1)[-1]  # never print credentials
        return urlunsplit(parts._replace(netloc=host, path=posixpath.join(parts.path, path), query=""))

    def child(self, path: str) -> "Storage":
        """A Storage rooted at `path` under this one."""
        if self.local:
            return Storage(os.path.join(self.base, *path.split("/")))
        parts = urlsplit(self.location)
        return Storage(urlunsplit(parts._replace(path=posixpath.join(parts.path, path))))

    def _full(self, path: str) -> str:
        return posixpath.join(self.base, path) if path else self.base

    # -- reading -------------------------------------------------------------------------------
    def read(self, path: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._full(path)) as data:
                return bytes(data.read())
        except FileNotFoundError:
            return None
        except OSError as error:  # some filesystems report a missing object as a generic error
            if "not found" in str(error).lower() or "does not exist" in str(error).lower():
                return None
            raise

    def read_json(self, path: str) -> Any:
        for attempt in range(_JSON_READ_ATTEMPTS):
            data = self.read(path)
            if data is None:
                return None
            try:
                return json.loads(data)
            except ValueError:  # a replacement still being written: read it again
                if attempt == _JSON_READ_ATTEMPTS - 1:
                    raise
                time.sleep(0.05)

    def exists(self, path: str) -> bool:
        return bool(self.fs.get_file_info(self._full(path)).type != pafs.FileType.NotFound)

    def list(self, path: str) -> list[str]:
        """Names of the entries directly under `path` (empty if it does not exist)."""
        selector = pafs.FileSelector(self._full(path), allow_not_found=True)
        return sorted(info.base_name for info in self.fs.get_file_info(selector))

    def read_parquet(self, path: str, schema: pa.Schema | None = None) -> pa.Table:
        return pq.read_table(self._full(path), schema=schema, filesystem=self.fs)

    # -- writing -------------------------------------------------------------------------------
    def write(self, path: str, data: bytes) -> None:
        full = self._full(path)
        self.fs.create_dir(posixpath.dirname(full), recursive=True)
        if not self.local:
            with self.fs.open_output_stream(full) as out:
                out.write(data)
            return
        tmp = f"{full}.tmp-{os.getpid()}"
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, full)

    def write_json(self, path: str, value: Any) -> None:
        self.write(path, json.dumps(value).encode())

    def create(self, path: str, data: bytes) -> bool:
        """Write `path` only if it does not exist yet; True if this call created it. Atomic: of
        several writers racing for the same name exactly one gets True, and readers never see a
        partial file."""
        full = self._full(path)
        if self.local:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            tmp = f"{full}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, full)  # fails if the name exists: the first writer wins
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        scheme = urlsplit(self.location).scheme
        if scheme in ("s3", "s3a"):
            self.fs.create_dir(posixpath.dirname(full), recursive=True)  # the bucket, if allowed
            return self._s3_create(full, data)
        raise CreateNotSupported(
            f"{self.describe()}: no atomic create-if-absent on {scheme}:// here (supported: local disk, S3)")

    def create_json(self, path: str, value: Any) -> bool:
        return self.create(path, json.dumps(value).encode())

    def _s3_create(self, full: str, data: bytes) -> bool:
        import boto3  # only needed for S3 locations
        from botocore.exceptions import ClientError

        parts = urlsplit(self.location)
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        endpoint = options.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{options.get('scheme', 'https')}://{endpoint}"
        # Credentials from the environment or boto3's credential chain, as for pyarrow (never the location).
        client = boto3.client("s3", endpoint_url=endpoint, region_name=options.get("region"))
        bucket, _, key = full.partition("/")
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412",
                                                                "ConditionalRequestConflict"):
                return False
            raise

    def delete(self, path: str) -> None:
        """Remove a file or a whole directory; nothing if absent."""
        full = self._full(path)
        info = self.fs.get_file_info(full)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(full)
        elif info.type != pafs.FileType.NotFound:
            self.fs.delete_file(full)

    def move(self, source: str, target: str) -> None:
        """Rename a file (object stores copy it)."""
        full = self._full(target)
        self.fs.create_dir(posixpath.dirname(full), recursive=True)
        self.fs.move(self._full(source), full)

    def move_to(self, path: str, target: "Storage", target_path: str) -> None:
        """Move a file to another location: a rename on one local filesystem, a copy (under a
        temporary name, then renamed) on another; within one object store, the store's own move;
        else a copy through this process and a delete."""
        if self.local and target.local:
            source, final = self._full(path), target._full(target_path)
            target.fs.create_dir(posixpath.dirname(final), recursive=True)
            try:
                os.replace(source, final)
                return
            except OSError as error:
                if error.errno != errno.EXDEV:
                    raise
            # Hidden while it is copied (readers skip names starting with '.'), and gone if it fails.
            folder, name = os.path.split(final)
            tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                with open(source, "rb") as src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, final)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise
            os.remove(source)
            return
        if not self.local and not target.local and self.fs.equals(target.fs):
            # One store: it moves the object itself (a server-side copy on S3 and GCS, a rename on HDFS).
            final = target._full(target_path)
            target.fs.create_dir(posixpath.dirname(final), recursive=True)
            self.fs.move(self._full(path), final)
            return
        target.write(target_path, self.read(path) or b"")
        self.delete(path)

    def full_path(self, path: str = "") -> str:
        """The path as this location's filesystem names it (for pyarrow and Spark readers)."""
        return self._full(path)

    def write_parquet(self, path: str, table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self.write(path, sink.getvalue().to_pybytes())
