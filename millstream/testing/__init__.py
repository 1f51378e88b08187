"""Test millstream computations and pipelines in-process, without Spark."""

from millstream.testing.harness import PipelineHarness

__all__ = ["PipelineHarness"]
