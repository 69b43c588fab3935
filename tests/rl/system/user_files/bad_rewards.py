"""Rewards that can never succeed, for the tests that a run ends on them (``--reward
FILE.py:nan_reward``): each returns something that is not a finite number, or takes no
arguments."""

from __future__ import annotations


def nan_reward(prompt: str, response: str) -> float:
    return float("nan")


def text_reward(prompt: str, response: str) -> str:
    return "good"


def no_arguments() -> float:
    return 1.0
