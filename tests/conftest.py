import pytest


@pytest.fixture(scope="session")
def s3_server():
    from s3server import S3Server

    server = S3Server()
    yield server
    server.stop()
