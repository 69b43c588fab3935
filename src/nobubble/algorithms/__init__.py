"""Algorithms used across nobubble."""

from nobubble.algorithms.merge import (
    ListNode,
    from_list,
    kmerge,
    merge_k_lists,
    merge_k_lists_pairwise,
    merge_two_lists,
    to_list,
)

__all__ = [
    "ListNode",
    "from_list",
    "to_list",
    "merge_k_lists",
    "merge_k_lists_pairwise",
    "merge_two_lists",
    "kmerge",
]
