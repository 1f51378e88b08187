"""Photon's configuration refused where it is written, in one line naming what is wrong: not later,
inside a Spark task, or never (a registry no two pipelines share)."""

from __future__ import annotations

import pytest

from millstream.photon import open_registry
from millstream.photon.pipeline import PhotonPipelineSpec, load_adapter


def spec(**changes):
    return PhotonPipelineSpec("photon-a", "/data/a", "/logs/q", "/logs/c", "/logs/r", "sqlite:////data/ids.db",
                              **changes)


@pytest.mark.parametrize("changes, message", [
    ({"max_outstanding": 0}, "max_outstanding must be at least 1, got 0"),
    ({"dispatch_shards": 0}, "dispatch_shards must be at least 1, got 0"),
    ({"key_groups": 0}, "key_groups must be at least 1, got 0"),
    ({"max_disorder_ms": -1}, "max_disorder_ms must be at least 0, got -1"),
    ({"trigger_ms": -5}, "trigger_ms must be at least 0, got -5"),
    ({"adapter": "millstream.photon.adapter"}, "adapter must be 'module:Class', got 'millstream.photon.adapter'"),
])
def test_a_spec_out_of_range_is_refused_when_made(changes, message):
    with pytest.raises(ValueError, match=message):
        spec(**changes)


def test_an_owner_must_be_named():
    with pytest.raises(ValueError, match="owner must be a non-empty string without ./., got .."):
        PhotonPipelineSpec("", "/data/a", "/logs/q", "/logs/c", "/logs/r", "sqlite:////data/ids.db")


def test_an_adapter_that_is_not_there_is_named():
    with pytest.raises(ValueError, match="adapter 'millstream.photon.adapter:Nope': module "
                                         "'millstream.photon.adapter' has no attribute 'Nope'"):
        load_adapter("millstream.photon.adapter:Nope")


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:///:memory:"])
def test_a_sqlite_registry_without_a_file_is_refused(url):
    """sqlite3 gives each connection of an empty path (or :memory:) a database of its own: two
    pipelines would never see each other's registrations, and each would join every click."""
    with pytest.raises(ValueError, match="needs the path of a file every pipeline opens"):
        open_registry(url)


def test_a_sqlite_registry_in_a_missing_directory_names_it(tmp_path):
    with pytest.raises(ValueError, match=f"directory {str(tmp_path / 'nowhere')!r} does not exist"):
        open_registry(f"sqlite:///{tmp_path}/nowhere/ids.db")


def test_a_dispatcher_made_directly_refuses_the_same_mistakes():
    from millstream.photon.dispatcher import Dispatcher, RegistrySpec

    with pytest.raises(ValueError, match="max_outstanding must be at least 1"):
        Dispatcher("photon-a", RegistrySpec("sqlite:////data/ids.db"), "/data/events", max_outstanding=0)
