"""k-way merge: LeetCode 23 examples, edge cases, stability, scale, and properties vs sorted()."""

from __future__ import annotations

import heapq
import sys
from itertools import chain

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nobubble.algorithms.merge import (
    ListNode,
    from_list,
    kmerge,
    merge_k_lists,
    merge_k_lists_pairwise,
    to_list,
)

MERGERS = [merge_k_lists, merge_k_lists_pairwise]


@pytest.mark.parametrize("merge", MERGERS)
@pytest.mark.parametrize(
    "lists, expected",
    [
        ([[1, 4, 5], [1, 3, 4], [2, 6]], [1, 1, 2, 3, 4, 4, 5, 6]),  # LeetCode 23 example 1
        ([], []),  # example 2
        ([[]], []),  # example 3
        ([[], [], []], []),
        ([[7]], [7]),  # k = 1
        ([[-3, -1, 0], [-2, -2, 5]], [-3, -2, -2, -1, 0, 5]),  # negatives, duplicates
        ([[2, 2, 2], [2, 2]], [2, 2, 2, 2, 2]),
    ],
)
def test_leetcode_examples(merge, lists, expected):
    assert to_list(merge([from_list(xs) for xs in lists])) == expected


@pytest.mark.parametrize("merge", MERGERS)
def test_none_entries_and_k0(merge):
    assert merge([]) is None
    assert merge([None, None]) is None
    assert to_list(merge([None, from_list([1, 3]), None, from_list([2])])) == [1, 2, 3]


class Key:
    """A value that compares by ``k`` only and remembers where it came from."""

    def __init__(self, k, tag):
        self.k, self.tag = k, tag

    def __lt__(self, other):
        return self.k < other.k

    def __eq__(self, other):
        return self.k == other.k


@pytest.mark.parametrize("merge", MERGERS)
def test_stable_and_relinks_nodes(merge):
    inputs = [[Key(1, "a0"), Key(2, "a1")], [Key(1, "b0"), Key(1, "b1")], [Key(1, "c0")]]
    heads = [from_list(xs) for xs in inputs]
    nodes = {id(n) for h in heads for n in _nodes(h)}
    out = merge(heads)
    assert [v.tag for v in to_list(out)] == ["a0", "b0", "b1", "c0", "a1"]
    assert {id(n) for n in _nodes(out)} == nodes  # same node objects, none copied


def _nodes(head):
    while head is not None:
        yield head
        head = head.next


@pytest.mark.parametrize("merge", MERGERS)
def test_many_single_node_lists(merge):
    k = 100_000
    vals = [(i * 7919) % k for i in range(k)]
    out = to_list(merge([ListNode(v) for v in vals]))
    assert out == sorted(vals)


@pytest.mark.parametrize("merge", MERGERS)
def test_one_list_of_a_million(merge):
    n = 1_000_000
    limit = sys.getrecursionlimit()
    head = from_list(range(n))
    out = merge([head])
    assert sys.getrecursionlimit() == limit
    count, prev, node = 0, -1, out
    while node is not None:
        assert node.val == prev + 1
        prev, node, count = node.val, node.next, count + 1
    assert count == n


sorted_lists = st.lists(st.lists(st.integers(-50, 50)).map(sorted), max_size=12)


@given(sorted_lists)
def test_merge_k_lists_matches_sorted(lists):
    expected = sorted(chain.from_iterable(lists))
    for merge in MERGERS:
        assert to_list(merge([from_list(xs) for xs in lists])) == expected


@given(st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers())), max_size=8))
def test_kmerge_stable_like_sorted(raw):
    # Tag each item with (input index, position); sorted() on the key is stable, so sorting
    # the inputs' concatenation gives exactly the order a stable k-way merge must produce.
    lists = [
        sorted(((k, (i, j)) for j, (k, _) in enumerate(xs)), key=lambda t: t[0])
        for i, xs in enumerate(raw)
    ]
    expected = sorted(chain.from_iterable(lists), key=lambda t: t[0])
    assert list(kmerge(*lists, key=lambda t: t[0])) == expected
    rev = [list(reversed(xs)) for xs in lists]
    expected_rev = sorted(chain.from_iterable(rev), key=lambda t: t[0], reverse=True)
    assert list(kmerge(*rev, key=lambda t: t[0], reverse=True)) == expected_rev


@given(st.lists(st.lists(st.integers(-20, 20)).map(sorted), max_size=10))
def test_kmerge_matches_heapq_merge(lists):
    assert list(kmerge(*lists)) == list(heapq.merge(*lists))
    assert list(kmerge(*(iter(x) for x in lists))) == sorted(chain.from_iterable(lists))


def test_kmerge_is_lazy():
    def endless(start):
        i = start
        while True:
            yield i
            i += 2

    it = kmerge(endless(0), endless(1))
    assert [next(it) for _ in range(6)] == [0, 1, 2, 3, 4, 5]


def test_kmerge_check_sorted_names_input_and_position():
    with pytest.raises(ValueError, match=r"input 1 is not ascending at position 2"):
        list(kmerge([1, 2, 3], [1, 5, 4, 6], check_sorted=True))
    with pytest.raises(ValueError, match=r"input 0 is not descending at position 1"):
        list(kmerge([3, 4], [2, 1], reverse=True, check_sorted=True))
    assert list(kmerge([1, 3], [2], check_sorted=True)) == [1, 2, 3]


def test_kmerge_edge_cases():
    assert list(kmerge()) == []
    assert list(kmerge([], [])) == []
    assert list(kmerge([3, 1], reverse=True)) == [3, 1]
    assert list(kmerge(["b", "c"], ["a"], key=str.upper)) == ["a", "b", "c"]
