"""The public namespace is derived from one table (deepgemm_ref._exports): imports and __all__ of
deepgemm_ref, deepgemm_ref.utils (math, layout) and deepgemm_ref.runtime are generated from it."""

from __future__ import annotations

import importlib

import pytest

from deepgemm_ref import _exports


def test_generated_blocks_are_up_to_date():
    assert _exports.rewrite(check=True) == [], "run python -m deepgemm_ref._exports"


def test_every_row_points_at_an_object_of_its_home():
    seen = set()
    for e in _exports.EXPORTS:
        assert e.name not in seen, f"{e.name} listed twice"
        seen.add(e.name)
        home = importlib.import_module(f"deepgemm_ref.{e.home}" if e.home else "deepgemm_ref")
        if e.attr is not None:
            assert hasattr(home, e.attr), (e.name, e.home, e.attr)


@pytest.mark.parametrize("namespace,module", [("top", "deepgemm_ref"), ("utils", "deepgemm_ref.utils"),
                                              ("utils.math", "deepgemm_ref.utils.math"),
                                              ("utils.layout", "deepgemm_ref.utils.layout")])
def test_each_namespace_holds_exactly_its_table_rows(namespace, module):
    mod = importlib.import_module(module)
    assert mod.__all__ == _exports.names(namespace)
    for e in _exports.EXPORTS:
        if namespace in e.namespaces:
            home = importlib.import_module(f"deepgemm_ref.{e.home}")
            want = home if e.attr is None else getattr(home, e.attr)
            assert getattr(mod, e.name) is want, e.name


def test_runtime_all_lists_the_names_it_defines():
    import deepgemm_ref.runtime as rt

    assert rt.__all__ == _exports.defined_in("runtime")
    assert all(getattr(rt, n).__module__ in ("deepgemm_ref", "deepgemm_ref.runtime")
               for n in rt.__all__ if callable(getattr(rt, n)))
