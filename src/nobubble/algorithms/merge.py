"""Merge k sorted sequences: "merge k sorted lists" (LeetCode 23) on linked lists, by a heap of
the k heads (:func:`merge_k_lists`) or pairwise in log2(k) rounds
(:func:`merge_k_lists_pairwise`), and the lazy k-way merge of any iterables (:func:`kmerge`,
used for per-rank trace timelines). One contract: ascending (or descending with
``reverse``), stable (among equal keys the lower input index first, input order kept).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

__all__ = [
    "ListNode",
    "from_list",
    "to_list",
    "merge_k_lists",
    "merge_k_lists_pairwise",
    "merge_two_lists",
    "kmerge",
]


@dataclass(eq=False, slots=True)
class ListNode:
    """A singly linked list node, as LeetCode defines it."""

    val: Any
    next: ListNode | None = None

    def __repr__(self) -> str:  # a long list must not recurse through the default repr
        return (
            f"ListNode({self.val!r}, ...)" if self.next is not None else f"ListNode({self.val!r})"
        )


def from_list(values: Iterable[Any]) -> ListNode | None:
    """Build a linked list from ``values`` (in order); ``[]`` gives ``None``."""
    dummy = ListNode(None)
    tail = dummy
    for v in values:
        tail.next = ListNode(v)
        tail = tail.next
    return dummy.next


def to_list(head: ListNode | None) -> list[Any]:
    """The values of a linked list, head first."""
    out = []
    while head is not None:
        out.append(head.val)
        head = head.next
    return out


def merge_k_lists(lists: list[ListNode | None]) -> ListNode | None:
    """Merge k ascending linked lists into one ascending list by relinking their nodes.

    Args:
        lists: k heads, each ascending; ``None`` entries (empty lists) are allowed, k may be 0.
    Returns:
        The head of the merged list, or ``None`` when every input is empty.
    """
    # heap entries (val, list_index, seq, node): list_index breaks ties between lists
    # (stability), seq within one list, so nodes are never compared
    heap: list[tuple[Any, int, int, ListNode]] = []
    for i, node in enumerate(lists):
        if node is not None:
            heap.append((node.val, i, 0, node))
    heapq.heapify(heap)
    dummy = ListNode(None)
    tail = dummy
    while heap:
        _, i, seq, node = heap[0]
        nxt = node.next
        if nxt is not None:
            heapq.heapreplace(heap, (nxt.val, i, seq + 1, nxt))
        else:
            heapq.heappop(heap)
        tail.next = node
        tail = node
    tail.next = None
    return dummy.next


def merge_two_lists(a: ListNode | None, b: ListNode | None) -> ListNode | None:
    """Merge two ascending lists, ``a``'s nodes first among equals (iterative)."""
    dummy = ListNode(None)
    tail = dummy
    while a is not None and b is not None:
        if b.val < a.val:
            tail.next, b = b, b.next
        else:
            tail.next, a = a, a.next
        tail = tail.next
    tail.next = a if a is not None else b
    return dummy.next


def merge_k_lists_pairwise(lists: list[ListNode | None]) -> ListNode | None:
    """Divide-and-conquer merge: same contract as :func:`merge_k_lists`.

    Each round merges neighbours (0,1), (2,3), ...; keeping neighbours together keeps the
    merge stable, since the left list always holds the lower input indices.
    """
    work = list(lists)
    if not work:
        return None
    while len(work) > 1:
        merged = [merge_two_lists(work[i], work[i + 1]) for i in range(0, len(work) - 1, 2)]
        if len(work) % 2:
            merged.append(work[-1])
        work = merged
    return work[0]


def _checked(it: Iterable[Any], index: int, key: Callable[[Any], Any] | None, reverse: bool):
    """Yield ``it`` unchanged, raising ValueError at the first item out of order."""
    prev_key = None
    for pos, item in enumerate(it):
        k = item if key is None else key(item)
        if pos and ((k > prev_key) if reverse else (k < prev_key)):
            order = "descending" if reverse else "ascending"
            raise ValueError(
                f"kmerge: input {index} is not {order} at position {pos}: "
                f"{k!r} follows {prev_key!r}; sort each input first or pass check_sorted=False"
            )
        prev_key = k
        yield item


def kmerge(
    *iterables: Iterable[Any],
    key: Callable[[Any], Any] | None = None,
    reverse: bool = False,
    check_sorted: bool = False,
) -> Iterator[Any]:
    """Lazily merge sorted iterables into one sorted stream.

    Args:
        *iterables: k inputs, each sorted by ``key`` (descending when ``reverse``).
        key: sort key, as for ``sorted``; ``None`` compares items themselves.
        reverse: the inputs are descending and so is the output.
        check_sorted: raise ValueError naming the input index and position of the first item
            that is out of order (costs one comparison per item).
    Yields:
        Every item once, in order; equal keys keep the input order (lower index first).

    Memory is O(k); the last input left streams without heap operations.
    """
    its = [
        iter(_checked(it, i, key, reverse) if check_sorted else it)
        for i, it in enumerate(iterables)
    ]
    return _kmerge_values(its) if key is None and not reverse else _kmerge(its, key, reverse)


def _kmerge(its: list[Iterator[Any]], key: Callable[[Any], Any] | None, reverse: bool):
    """:func:`kmerge` with a key or descending."""
    # Entries [key, order, value, next], reused in place; ``order`` (the input index, negated
    # for the max-heap) breaks ties, so the merge is stable and items are never compared.
    key_of = key or _identity
    sign, heapify, replace, pop = (
        (-1, heapq._heapify_max, heapq._heapreplace_max, heapq._heappop_max)  # type: ignore[attr-defined]
        if reverse
        else (1, heapq.heapify, heapq.heapreplace, heapq.heappop)
    )
    heap: list[list[Any]] = []
    for order, it in enumerate(its):
        nxt = it.__next__
        try:
            value = nxt()
        except StopIteration:
            continue
        heap.append([key_of(value), sign * order, value, nxt])
    heapify(cast("list[Any]", heap))  # entries compare element-wise (key, order, ...)
    while len(heap) > 1:
        try:
            while True:
                entry = heap[0]
                yield entry[2]
                value = entry[3]()  # StopIteration when this input runs dry
                entry[0] = key_of(value)
                entry[2] = value
                replace(heap, entry)
        except StopIteration:
            pop(heap)
    if heap:
        _, _, value, nxt = heap[0]
        yield value
        yield from nxt.__self__  # the last input streams without heap operations


def _identity(value: Any) -> Any:
    return value


def _kmerge_values(its: list[Iterator[Any]]) -> Iterator[Any]:
    """Ascending merge without a key, the hot path: entries ``[value, order, next]``."""
    heap: list[list[Any]] = []
    replace, pop = heapq.heapreplace, heapq.heappop
    for order, it in enumerate(its):
        nxt = it.__next__
        try:
            heap.append([nxt(), order, nxt])
        except StopIteration:
            pass
    heapq.heapify(heap)
    while len(heap) > 1:
        try:
            while True:
                entry = heap[0]
                yield entry[0]
                entry[0] = entry[2]()  # StopIteration when this input runs dry
                replace(heap, entry)
        except StopIteration:
            pop(heap)
    if heap:
        value, _, nxt = heap[0]
        yield value
        yield from nxt.__self__
