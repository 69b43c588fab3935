"""Merge k sorted sequences: "merge k sorted lists" (LeetCode 23), and a lazy k-way merge.

Three entry points, one contract (ascending, stable: among equal keys the item from the input
with the lower index comes first, and within one input the original order is kept):

- ``merge_k_lists(lists)``: linked lists, heap of the k current heads, O(N log k) time, O(k)
  extra memory. Nodes are relinked, never copied, and the loop is iterative, so a list of
  10^6 nodes does not touch the recursion limit.
- ``merge_k_lists_pairwise(lists)``: divide and conquer, merging pairs of lists in log2(k)
  rounds; the same O(N log k) without a heap.
- ``kmerge(*iterables, key=None, reverse=False)``: lazy generator over any iterables, O(k)
  memory. It is used to merge per-rank trace timelines (``nobubble.trace``).
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

    The heap holds ``(val, list_index, seq, node)``: ``list_index`` breaks ties between lists
    (stability), ``seq`` breaks ties within one list, so nodes themselves are never compared.
    """
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

    Memory is O(k): the heap holds one pending item per input. With k == 1 the input is
    passed through untouched, and when all but one input run dry the rest is streamed
    without heap operations.
    """
    its = [
        iter(_checked(it, i, key, reverse) if check_sorted else it)
        for i, it in enumerate(iterables)
    ]
    if reverse:
        yield from _kmerge_reverse(its, key)
        return
    # Heap entries are lists so heapreplace can reuse them: [value, order, next] without a
    # key, [key, order, value, next] with one. ``order`` (the input index) breaks ties, which
    # makes the merge stable and means items themselves are never compared.
    heap: list[list[Any]] = []
    replace, pop = heapq.heapreplace, heapq.heappop
    if key is None:
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
            yield from nxt.__self__  # the last input streams without heap operations
        return
    for order, it in enumerate(its):
        nxt = it.__next__
        try:
            value = nxt()
        except StopIteration:
            continue
        heap.append([key(value), order, value, nxt])
    heapq.heapify(heap)
    while len(heap) > 1:
        try:
            while True:
                entry = heap[0]
                yield entry[2]
                value = entry[3]()
                entry[0] = key(value)
                entry[2] = value
                replace(heap, entry)
        except StopIteration:
            pop(heap)
    if heap:
        _, _, value, nxt = heap[0]
        yield value
        yield from nxt.__self__


def _kmerge_reverse(its: list[Iterator[Any]], key: Callable[[Any], Any] | None) -> Iterator[Any]:
    """Descending merge: a max-heap through heapq's max-heap helpers; ties favour the lower
    input index, so the order is negated (-0 > -1)."""
    heap: list[list[Any]] = []
    for order, it in enumerate(its):
        nxt = it.__next__
        try:
            value = nxt()
        except StopIteration:
            continue
        heap.append([value if key is None else key(value), -order, value, nxt])
    # typeshed wants list[SupportsRichComparison]; list is invariant, and the entries are
    # lists compared element-wise (key, -order, ...).
    heapq._heapify_max(cast("list[Any]", heap))
    replace = heapq._heapreplace_max  # type: ignore[attr-defined]
    while len(heap) > 1:
        try:
            while True:
                entry = heap[0]
                yield entry[2]
                value = entry[3]()
                entry[0] = value if key is None else key(value)
                entry[2] = value
                replace(heap, entry)
        except StopIteration:
            heapq._heappop_max(heap)  # type: ignore[attr-defined]
    if heap:
        _, _, value, nxt = heap[0]
        yield value
        yield from nxt.__self__
