"""Which of the user's modules the Spark runner ships by value (runner._modules_referenced): those of
the pipeline's classes and functions, their base classes, and the functions and modules their code
names; not millstream's or installed packages' own."""

import importlib
import sys

from millstream.spark.runner import CONTAINER_ITEMS_WALKED, _modules_referenced, _users_module

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
