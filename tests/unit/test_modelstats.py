"""count_parameters: shared weights are counted once."""

from __future__ import annotations

import pytest
import torch

from workbench.modelstats import count_parameters


def test_plain_module():
    assert count_parameters(torch.nn.Linear(4, 3)) == 4 * 3 + 3


def test_tied_embedding_counted_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    assert count_parameters(torch.nn.Sequential(emb, head)) == 40


def test_distinct_parameters_viewing_the_same_storage_counted_once():
    a = torch.nn.Linear(3, 3)
    b = torch.nn.Linear(3, 3)
    b.weight = torch.nn.Parameter(a.weight.data)  # a different Parameter, the same memory
    assert count_parameters(torch.nn.ModuleList([a, b])) == 9 + 3 + 3


def test_views_of_different_parts_of_one_storage_are_both_counted():
    base = torch.zeros(8)
    m = torch.nn.Module()
    m.p = torch.nn.Parameter(base[:4])
    m.q = torch.nn.Parameter(base[4:])
    assert count_parameters(m) == 8


def test_meta_device_model():
    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10))
    assert count_parameters(m) == 100 * 100 + 100 + 100 * 10 + 10


def test_trainable_only():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    m[0].requires_grad_(False)
    assert count_parameters(m, trainable_only=True) == 4 * 2 + 2
    assert count_parameters(m) == 20 + 10


def test_feeds_the_estimator():
    import workbench

    m = torch.nn.Linear(10, 10)
    e = workbench.estimate_memory(n_params=workbench.count_parameters(m))
    assert e.n_params == 110 and e.total_bytes == 110 * 16


@pytest.mark.parametrize("bad", [None, "model", [torch.nn.Linear(1, 1)]])
def test_rejects_non_modules(bad):
    with pytest.raises(ValueError, match=r"module=\w+: must be a torch.nn.Module"):
        count_parameters(bad)


def test_rejects_non_bool_flag():
    with pytest.raises(ValueError, match=r"trainable_only=1: must be True or False"):
        count_parameters(torch.nn.Linear(1, 1), trainable_only=1)
