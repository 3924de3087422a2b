"""The split state store: earlier requests' prefix split states found by row key, bounded by bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sgl_ridgefill.runtime.exact_rows import prefix_keys
from sgl_ridgefill.runtime.host_rows import HostRows
from sgl_ridgefill.runtime.split_state_store import SplitStateStore

CPU = torch.device("cpu")
HIDDEN = 8


def _rows(values: torch.Tensor) -> HostRows:
    rows = HostRows(values.shape[0], values.shape[1], values.dtype, CPU)
    rows.write(0, values)
    return rows


def _document(seed: int, n: int, namespace: str = "rf:a") -> tuple[np.ndarray, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 1000, (n,), generator=g).tolist()
    return prefix_keys(namespace, tokens), torch.randn(n, HIDDEN, generator=g)


def test_a_later_request_finds_the_rows_an_earlier_one_kept_in_its_own_order():
    keys, x = _document(0, 40)
    store = SplitStateStore(capacity=1 << 20)
    store.keep(keys[10:40], _rows(x[10:40]))  # rows 10..39 of the first request's prompt
    assert len(store) == 30 and store.bytes == 30 * HIDDEN * 4
    want = np.array([35, 3, 12, 39, 20])  # one row (3) the store never held
    found, got = store.gather(keys[want], CPU)
    assert found.tolist() == [True, False, True, True, True]
    assert torch.equal(got, x[want[found]])


def test_nothing_found_is_none_and_other_namespaces_miss():
    keys, x = _document(1, 20)
    store = SplitStateStore(capacity=1 << 20)
    store.keep(keys, _rows(x))
    other, _ = _document(1, 20, namespace="rf:b")  # the same tokens under another plan's namespace
    found, got = store.gather(other, CPU)
    assert not found.any() and got is None


def test_rows_found_across_several_buffers():
    keys_a, x_a = _document(2, 16)
    keys_b, x_b = _document(3, 16)
    store = SplitStateStore(capacity=1 << 20)
    store.keep(keys_a, _rows(x_a))
    store.keep(keys_b, _rows(x_b))
    found, got = store.gather(np.concatenate([keys_a[[1, 2]], keys_b[[5]], keys_a[[9]]]), CPU)
    assert found.all()
    assert torch.equal(got, torch.cat([x_a[[1, 2]], x_b[[5]], x_a[[9]]]))


def test_the_least_recently_used_buffer_leaves_first_and_the_capacity_holds():
    size = 10 * HIDDEN * 4
    store = SplitStateStore(capacity=2 * size)
    docs = [_document(seed, 10) for seed in (4, 5, 6)]
    store.keep(docs[0][0], _rows(docs[0][1]))
    store.keep(docs[1][0], _rows(docs[1][1]))
    store.gather(docs[0][0][:1], CPU)  # the first is used again: the second is now the oldest
    store.keep(docs[2][0], _rows(docs[2][1]))
    assert store.bytes == 2 * size and len(store) == 20
    assert store.gather(docs[0][0], CPU)[0].all() and store.gather(docs[2][0], CPU)[0].all()
    assert not store.gather(docs[1][0], CPU)[0].any()


def test_a_newer_buffer_takes_a_key_over_and_dropping_the_older_keeps_it():
    keys, x = _document(7, 12)
    size = 12 * HIDDEN * 4
    store = SplitStateStore(capacity=2 * size)
    store.keep(keys, _rows(x))
    again = x + 1  # the same rows computed again (another chunking rounds differently)
    store.keep(keys, _rows(again))
    assert len(store) == 12
    other_keys, other = _document(8, 12)
    store.keep(other_keys, _rows(other))  # the first buffer leaves; its keys point to the second
    found, got = store.gather(keys, CPU)
    assert found.all() and torch.equal(got, again)


def test_a_buffer_larger_than_the_store_and_a_zero_store_keep_nothing():
    keys, x = _document(9, 10)
    for capacity in (0, 10 * HIDDEN * 4 - 1):
        store = SplitStateStore(capacity=capacity)
        store.keep(keys, _rows(x))
        assert len(store) == 0 and store.bytes == 0
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        SplitStateStore(capacity=-1)


def test_keys_and_rows_must_match():
    keys, x = _document(10, 10)
    store = SplitStateStore(capacity=1 << 20)
    with pytest.raises(AssertionError):
        store.keep(keys[:9], _rows(x))


def test_keeping_drops_the_copy_back_on_the_device():
    keys, x = _document(11, 6)
    rows = _rows(x)
    rows.read()  # sweep 2 gathered from it: the buffer has a copy back
    assert rows._back is not None  # noqa: SLF001
    SplitStateStore(capacity=1 << 20).keep(keys, rows)
    assert rows._back is None  # noqa: SLF001 - on a GPU that copy is the prefix's size in device memory


def test_a_buffer_whose_every_key_a_newer_one_took_leaves_at_once():
    # Two requests fill the same uncached document at once (or it is filled again after the radix cache dropped
    # it): the newer buffer names every row, so the older one holds nothing reachable and must not keep its bytes
    # or push a live buffer out first.
    keys, x = _document(7, 10)
    other_keys, other_x = _document(8, 10)
    size = 10 * HIDDEN * 4
    store = SplitStateStore(capacity=2 * size)
    store.keep(other_keys, _rows(other_x))  # the oldest live buffer
    store.keep(keys, _rows(x))
    store.keep(keys, _rows(x + 1))  # takes every key of the previous buffer
    assert store.bytes == 2 * size and len(store) == 20
    found, got = store.gather(other_keys, CPU)
    assert found.all() and torch.equal(got, other_x)
    found, got = store.gather(keys[[0, 9]], CPU)
    assert found.all() and torch.equal(got, x[[0, 9]] + 1)


def test_a_buffer_that_keeps_some_of_its_keys_stays():
    keys, x = _document(9, 10)
    store = SplitStateStore(capacity=1 << 20)
    store.keep(keys, _rows(x))
    store.keep(keys[4:], _rows(x[4:] + 1))  # a later request held only rows 4..9 new
    assert store.bytes == 16 * HIDDEN * 4
    found, got = store.gather(keys[[0, 5]], CPU)
    assert found.all() and torch.equal(got, torch.stack([x[0], x[5] + 1]))
