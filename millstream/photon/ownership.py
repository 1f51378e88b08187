"""An owner name belongs to one pipeline root for its whole life; a pipeline on another root is refused.

Why: a dispatch token is (owner, "<attempt>/<click record id>"), and a click log's record ids are the
same on every read. The registry answers an owner's own token COMMITTED (the lost reply) and an earlier
attempt of the owner on the same record RECLAIMED (a batch Spark never committed). Both rules are right
only while everything the owner registered went through one root, whose checkpoint says what Spark
committed. A pipeline started under the same name on a fresh root (its checkpoint and state lost) would
be handed back every click it had already joined and published, and a second pipeline under the same
name at the same time would join every click the first one did.

How: a root gets an identity at its first start (a random id in `photon-root.json` inside the root, so
it is lost with the root), and the registry binds each owner name to the first root that starts under
it (`IdRegistry.bind_owner`, atomic in every backend). A start whose root is not the one its owner
name is bound to is refused with `OwnerOfAnotherRoot`. Two pipelines on one root are kept apart by the
root itself (the Spark runner's lease), not here.
"""

from __future__ import annotations

import json
import os
import uuid

from millstream.photon.registry import IdRegistry, OwnerRoot

ROOT_IDENTITY_FILE = "photon-root.json"


class OwnerOfAnotherRoot(RuntimeError):
    """The owner name is bound to another pipeline root: start this pipeline under a new owner name."""


def root_identity(root_dir: str) -> OwnerRoot:
    """The identity of the root at `root_dir`, made and kept there at its first call.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> root_identity(root) == root_identity(root), root_identity(root).location == os.path.abspath(root)
    (True, True)
    """
    path = os.path.join(root_dir, ROOT_IDENTITY_FILE)
    kept = _read_identity(path)
    if kept is not None:
        return kept
    os.makedirs(root_dir, exist_ok=True)
    made = OwnerRoot(uuid.uuid4().hex, os.path.abspath(root_dir))
    draft = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(draft, "w", encoding="utf-8") as out:
        json.dump({"root_id": made.root_id, "location": made.location}, out)
        out.flush()
        os.fsync(out.fileno())
    try:
        # A link never replaces a file: of two first starts on one root, the first identity stays.
        os.link(draft, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(draft)
    _fsync_directory(root_dir)  # an identity the registry has bound must not vanish in a power cut
    kept = _read_identity(path)
    assert kept is not None, path
    return kept


def claim_owner_root(registry: IdRegistry, owner: str, root_dir: str) -> OwnerRoot:
    """Bind `owner` to the root at `root_dir` if it is bound to none; refuse (OwnerOfAnotherRoot) if it
    is bound to another root. Call before the pipeline starts."""
    mine = root_identity(root_dir)
    bound = registry.bind_owner(owner, mine)
    if bound.root_id != mine.root_id:
        raise OwnerOfAnotherRoot(
            f"owner {owner!r} belongs to root {bound.location} (id {bound.root_id}), not to this root "
            f"{mine.location} (id {mine.root_id}: a new root, or another one); a pipeline on a new root "
            "needs a new owner name")
    return bound


def _read_identity(path: str) -> OwnerRoot | None:
    try:
        with open(path, encoding="utf-8") as kept:
            data = json.load(kept)
    except FileNotFoundError:
        return None
    return OwnerRoot(str(data["root_id"]), str(data["location"]))


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
