"""Which of the user's modules the Spark runner ships by value (runner._modules_referenced): those of
the pipeline's classes and functions, their base classes, and the functions and modules their code
names; not millstream's or installed packages' own. What cannot be pickled at all is refused before
Spark starts (shipping.check_picklable), naming where it is."""

import importlib
import re
import sys
import threading

import pytest

from millstream import Computation, Pipeline, PipelineError, ScriptedInjector
from millstream.spark.runner import CONTAINER_ITEMS_WALKED, SparkRunner, _modules_referenced, _users_module
from millstream.spark.shipping import check_picklable

MODULES = {
    "shipping_helpers": "def doubled(n):\n    return 2 * n\n",
    "shipping_tools": "import shipping_helpers\n\n\ndef tripled(n):\n    return 3 * n\n",
    "shipping_base": ("import shipping_tools\nfrom millstream import Computation\n\n\nclass Base(Computation):\n"
                      "    def process_record(self, ctx, record):\n"
                      "        return shipping_tools.tripled(record.value)\n"),
    "shipping_user": ("from shipping_base import Base\nfrom shipping_helpers import doubled\n\n\nclass Mine(Base):\n"
                      "    def plus(self, n):\n        return [doubled(m) for m in range(n)]\n"),
}


def load(tmp_path, monkeypatch):
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("shipping_user")


def test_bases_named_functions_and_named_modules_are_found(tmp_path, monkeypatch):
    user = load(tmp_path, monkeypatch)
    found = _modules_referenced([user.Mine()])
    # The class's module, its base's, the helper its method names (inside a comprehension), and the
    # module the base's method names.
    assert {"shipping_user", "shipping_base", "shipping_helpers", "shipping_tools"} <= found
    assert {name for name in found if _users_module(name)} == set(MODULES)


def test_large_containers_are_walked_only_in_part(tmp_path, monkeypatch):
    user = load(tmp_path, monkeypatch)
    table = [0] * (10 * CONTAINER_ITEMS_WALKED) + [user.Mine()]  # past the part walked
    assert "shipping_user" not in _modules_referenced([table])
    assert "shipping_user" in _modules_referenced([[user.Mine(), *table]])


# -- what cannot be pickled, found before Spark starts ---------------------------------------------
class Locked(Computation):
    def __init__(self):
        self.lock = threading.Lock()


class Client:
    def __init__(self):
        self.url = "http://example"
        self._lock = threading.RLock()


class HoldsAClient(Computation):
    def __init__(self):
        self.retries = 3
        self.client = Client()


class LockedInjector(ScriptedInjector):
    def __init__(self):
        super().__init__("src", [])
        self.guard = threading.Lock()


def pipeline(computation=None, injector=None):
    return (Pipeline("p").add_injector("src", injector or ScriptedInjector("src", []), "in")
            .add_computation("c", computation or Computation(), ["in"], ["out"]))


def test_what_cannot_be_pickled_is_named_with_the_attribute_holding_it():
    check_picklable(pipeline())  # nothing to say
    with pytest.raises(PipelineError, match=re.escape(
            "computation 'c' cannot be sent to Spark's workers: attribute 'lock' holds a _thread.lock, which "
            "cannot be pickled; create it in setup()")):
        check_picklable(pipeline(Locked()))
    with pytest.raises(PipelineError, match=re.escape(
            "computation 'c' cannot be sent to Spark's workers: attribute 'client._lock' holds a _thread.RLock, "
            "which cannot be pickled; create it in setup()")):
        check_picklable(pipeline(HoldsAClient()))
    with pytest.raises(PipelineError, match=re.escape(
            "injector 'src' cannot be sent to Spark's workers: attribute 'guard' holds a _thread.lock, which "
            "cannot be pickled; create it where it is first used (in read())")):
        check_picklable(pipeline(injector=LockedInjector()))
    lock = threading.Lock()
    with pytest.raises(PipelineError, match=re.escape(
            "computation 'c': the key extractor for stream 'in' cannot be sent to Spark's workers: TypeError: "
            "cannot pickle '_thread.lock' object")):
        check_picklable(Pipeline("p").add_injector("src", ScriptedInjector("src", []), "in")
                        .add_computation("c", Computation(), {"in": lambda record: str(lock)}, ["out"]))


class NoSpark:
    """A session the runner must not use."""

    def __getattr__(self, name):
        raise AssertionError(f"Spark was used ({name})")


def test_the_spark_runner_refuses_what_cannot_be_pickled_before_spark_starts(tmp_path):
    runner = SparkRunner(pipeline(Locked()), root=str(tmp_path / "root"), spark=NoSpark())
    with pytest.raises(PipelineError, match="computation 'c' cannot be sent to Spark's workers: attribute 'lock'"):
        runner.start()
    assert not (tmp_path / "root" / "lease.json").exists()  # nor the root claimed
