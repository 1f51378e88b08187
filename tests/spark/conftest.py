"""Real local Spark for the end-to-end tests: one session shared by the whole test run."""

import os

import pytest


def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from millstream.spark.session import create_session

    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = create_session("local[2]", "millstream-tests", log_path=str(log))
    yield session
    session.stop()
