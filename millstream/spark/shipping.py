"""What the Spark runner sends to Spark's workers must pickle (with cloudpickle, as Spark does): a
computation or injector holding a lock, an open connection or a thread is refused before Spark starts,
naming it and, where it is an attribute, the attribute, rather than as Spark's "Could not serialize
object" naming neither."""

from __future__ import annotations

from typing import Any, Callable

from millstream.model.pipeline import Pipeline, PipelineError

# How deep attributes are looked into for the one that cannot be pickled (client._pool._lock is 3).
ATTRIBUTE_DEPTH = 4


def check_picklable(pipeline: Pipeline) -> None:
    """Raise PipelineError naming the first computation, injector or key extractor of `pipeline` that
    cannot be pickled, and the attribute that holds what cannot be, if it is one."""
    for name, node in sorted(pipeline.computations.items()):
        _check(node.computation, f"computation {name!r}", "create it in setup()")
        for stream, extractor in node.inputs.items():
            _check(extractor, f"computation {name!r}: the key extractor for stream {stream!r}",
                   "create it where it is first used")
    for name, injected in sorted(pipeline.injectors.items()):
        _check(injected.injector, f"injector {name!r}", "create it where it is first used (in read())")


def _check(obj: Any, what: str, advice: str) -> None:
    if obj is None:
        return
    dumps = _dumps()
    try:
        dumps(obj)
    except Exception as error:
        found = _unpicklable_attribute(obj, dumps, ATTRIBUTE_DEPTH)
        if found is None:
            lines = str(error).strip().splitlines() or [""]
            raise PipelineError(f"{what} cannot be sent to Spark's workers: {type(error).__name__}: "
                                f"{lines[0]}") from None
        path, value = found
        kind = type(value)
        shown = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise PipelineError(f"{what} cannot be sent to Spark's workers: attribute {path!r} holds a {shown}, "
                            f"which cannot be pickled; {advice}") from None


def _dumps() -> Callable[[Any], bytes]:
    from pyspark import cloudpickle

    return cloudpickle.dumps


def _unpicklable_attribute(obj: Any, dumps: Callable[[Any], bytes], depth: int) -> tuple[str, Any] | None:
    """(dotted path, value) of the innermost attribute of `obj` that does not pickle, or None."""
    try:
        attributes = list(vars(obj).items())
    except TypeError:  # no __dict__
        return None
    for name, value in attributes:
        try:
            dumps(value)
        except Exception:
            deeper = _unpicklable_attribute(value, dumps, depth - 1) if depth > 1 else None
            if deeper is None:
                return name, value
            return f"{name}.{deeper[0]}", deeper[1]
    return None
