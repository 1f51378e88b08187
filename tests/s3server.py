"""A throwaway S3 endpoint on 127.0.0.1 (moto's server) for tests of remote roots.

Its locations carry no credentials (millstream refuses those): tests/conftest.py puts moto's dummy
keys in the environment, where every process (the driver, Spark's JVM and its Python workers, worker
processes) finds them through the AWS credential chain."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid


class S3Server:
    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        executable = shutil.which("moto_server")
        if executable is None:
            raise RuntimeError("moto_server not found: pip install -e '.[test]' installs it")
        self.process = subprocess.Popen([executable, "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.time() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("the S3 test server did not start")
                time.sleep(0.1)

    def location(self, prefix: str) -> str:
        """A fresh bucket on this server, as a millstream location with pyarrow's S3 options."""
        bucket = f"t{uuid.uuid4().hex[:12]}"
        return (f"s3://{bucket}/{prefix}?endpoint_override=127.0.0.1:{self.port}&scheme=http"
                "&region=us-east-1&allow_bucket_creation=true")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
