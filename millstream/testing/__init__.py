"""Test millstream computations and pipelines in-process, without Spark."""

from millstream.testing.harness import HarnessStopped, PipelineHarness

__all__ = ["HarnessStopped", "PipelineHarness"]
