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

    scratch = tmp_path_factory.mktemp("spark")
    # Managed tables go to a scratch warehouse, not into the directory the tests run from.
    session = create_session("local[2]", "millstream-tests", log_path=str(scratch / "spark.log"),
                             conf={"spark.sql.warehouse.dir": str(scratch / "warehouse")})
    # Derby (the JDBC sink tests' database) writes its log into the working directory unless told.
    session._jvm.java.lang.System.setProperty("derby.stream.error.file", str(scratch / "derby.log"))
    yield session
    session.stop()
