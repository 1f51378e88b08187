import gc
import os

import pytest

# The S3 test server's (moto's) dummy credentials, set before Spark's JVM or any worker starts so that
# every process finds them in the environment: locations never carry credentials.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="session")
def s3_server():
    from s3server import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def unfrozen_collector():
    """A worker task run in a test's own process freezes what is alive (spark/worker_garbage.py):
    later tests must not find their objects hidden from the collector."""
    yield
    gc.unfreeze()
