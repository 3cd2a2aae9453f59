"""common.tune: a kernel file's constants set per configuration, each built on its own (nvcc only, no GPU)."""

import pytest

from common import tune
from tests.conftest import REPO, needs_nvcc

KERNEL = REPO / "task4/kernels/attention.cu"  # the student's file: the skeleton in a fresh handout


def test_the_tunables_are_the_top_level_integer_constants():
    found = tune.tunables(KERNEL.read_text())
    assert {"BLOCK_ROWS", "BLOCK_COLS", "THREAD_ROWS", "THREAD_COLS", "MIN_BLOCKS_PER_SM"} <= set(found)
    assert "ROW_THREADS" not in found  # derived from the others, not set by hand


def test_a_configuration_changes_only_its_constants():
    text = KERNEL.read_text()
    changed = tune.configure(text, tune.parse_config("BLOCK_ROWS=64, THREAD_COLS=4"))
    assert tune.tunables(changed) == tune.tunables(text) | {"BLOCK_ROWS": 64, "THREAD_COLS": 4}
    assert len(changed.splitlines()) == len(text.splitlines())
    assert tune.configure(text, {}) == text


@pytest.mark.parametrize("spec, words", [("BLOCK_ROWS", "NAME=NUMBER"), ("BLOCK_ROWS=x", "NAME=NUMBER"),
                                         ("TILE=64", "TILE: not a top-level `constexpr int`")])
def test_a_bad_configuration_is_named(spec, words):
    with pytest.raises(ValueError, match=words):
        tune.configure(KERNEL.read_text(), tune.parse_config(spec))


@needs_nvcc
def test_each_configuration_builds_on_its_own_or_says_why_not(tmp_path):
    configs = [{}, {"MIN_BLOCKS_PER_SM": 2}, {"BLOCK_ROWS": 100, "THREAD_ROWS": 8}]  # as written; two blocks per SM; not whole tiles
    default, capped, ragged = tune.build_configs(KERNEL, configs, tmp_path, "90")
    assert default.error is None and default.kernels and not default.spills
    assert capped.error is None and max(k.registers for k in capped.kernels) <= 128  # 65536 / (256 threads x 2)
    assert ragged.error == "static_assert: the threads' micro-tiles cover the block's tile exactly" and not ragged.kernels
    assert KERNEL.read_text() == (REPO / "task4/kernels/attention.cu").read_text()  # the student's file untouched
