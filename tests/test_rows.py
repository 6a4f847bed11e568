"""rows.take picks the same rows as advanced indexing, in every shape."""

import torch

from fedforge.core.rows import take


def test_take_equals_advanced_indexing_for_any_index_shape() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 1, 4, 3, generator=gen)
    for shape in [(7,), (3, 4), (2, 3, 5), (0,)]:
        index = torch.randint(0, 50, shape, generator=gen)
        got = take(x, index)
        assert got.shape == (*shape, 1, 4, 3)
        assert torch.equal(got, x[index])


def test_take_of_labels_is_a_new_tensor() -> None:
    y = torch.arange(10)
    got = take(y, torch.tensor([[9, 0], [3, 3]]))
    assert got.tolist() == [[9, 0], [3, 3]]
    got[0, 0] = -1  # a copy, as x[index] is
    assert y[9] == 9
