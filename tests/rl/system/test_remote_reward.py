"""RemoteReward against the reference server and against canned answers written by hand.

The end-to-end reward is ``len(response) - len(prompt)``: any integer, negative included, so
a clipped, rounded or made-up score shows. Malformed answers come from a stub server that
replays a fixed body, independent of ``reward_server``, so the client's checks are tested
on their own.
"""

from __future__ import annotations

import json
import pickle
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nobubble.cli import main as cli_main
from nobubble.rl.system.rewards import RemoteReward, RewardFailure, RewardServer

PROMPTS = ["ab", "hello", "", "xyz", "é"]
RESPONSES = ["abcd", "hi", "", "x" * 10, "ü" * 3]


def length_gain(prompt: str, response: str) -> float:
    return float(len(response) - len(prompt))


@contextmanager
def canned_server(body: bytes, status: int = 200) -> Iterator[tuple[str, list[int]]]:
    """(url, hits): a server answering every POST with ``status`` and ``body``."""
    hits: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(1)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/score", hits
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_end_to_end_equals_the_reward_fn_applied_directly() -> None:
    expected = [length_gain(p, r) for p, r in zip(PROMPTS, RESPONSES)]
    assert min(expected) < 0 < max(expected)  # the data cover negative and positive rewards
    with RewardServer(length_gain) as server:
        rewards, num_retries = RemoteReward(server.url).score(PROMPTS, RESPONSES)
        assert RemoteReward(server.url).score(PROMPTS, RESPONSES)[0] == expected
        assert server.requests == 2  # one batched POST per call
    assert rewards == expected
    assert num_retries == 0


def test_retries_until_the_server_recovers() -> None:
    with RewardServer(length_gain, fail_first=2) as server:
        reward = RemoteReward(server.url, max_retries=2, backoff_s=0.0)
        rewards, num_retries = reward.score(PROMPTS, RESPONSES)
        assert server.requests == 3
    assert rewards == [length_gain(p, r) for p, r in zip(PROMPTS, RESPONSES)]
    assert num_retries == 2


def test_server_error_on_every_attempt_raises_naming_url_attempts_and_status() -> None:
    with RewardServer(length_gain, fail_status=500) as server:
        reward = RemoteReward(server.url, max_retries=1, backoff_s=0.0)
        with pytest.raises(RewardFailure, match="2 attempts") as info:
            reward.score(PROMPTS, RESPONSES)
        assert server.requests == 2
    assert "HTTP 500" in str(info.value)
    assert server.url in str(info.value)
    assert not info.value.retry  # the final failure: nothing more to try


def test_backoff_doubles_between_attempts() -> None:
    slept: list[float] = []
    with RewardServer(length_gain, fail_status=503) as server:
        reward = RemoteReward(server.url, max_retries=3, backoff_s=0.1, sleep=slept.append)
        with pytest.raises(RewardFailure, match="4 attempts"):
            reward.score(PROMPTS, RESPONSES)
        assert server.requests == 4
    assert slept == pytest.approx([0.1, 0.2, 0.4])  # backoff_s * 2**(a - 1) before attempt a


def test_client_timeout_is_an_error() -> None:
    with RewardServer(length_gain, delay_s=0.5) as server:
        reward = RemoteReward(server.url, timeout_s=0.1, max_retries=1, backoff_s=0.0)
        with pytest.raises(RewardFailure, match=r"timed out after 0\.1s") as info:
            reward.score(PROMPTS, RESPONSES)
    assert "2 attempts" in str(info.value)


def test_a_nan_from_the_reward_fn_is_an_error_not_a_score() -> None:
    with RewardServer(lambda p, r: float("nan")) as server:
        reward = RemoteReward(server.url, max_retries=1, backoff_s=0.0)
        with pytest.raises(RewardFailure, match="HTTP 500") as info:
            reward.score(PROMPTS, RESPONSES)
        assert server.requests == 2
    assert "nan" in str(info.value)


@pytest.mark.parametrize(
    "body",
    [
        b'{"rewards": [1.0]}',  # one reward for two pairs
        b'{"rewards": [1.0, 2.0, 3.0]}',
        b'{"rewards": [NaN, 1.0]}',  # Python's json emits and accepts NaN; we must not
        b'{"rewards": [1e999, 1.0]}',  # parses to inf
        b'{"rewards": [true, 1.0]}',
        b'{"rewards": ["1", 1.0]}',
        b'{"scores": [1.0, 2.0]}',
        b"[1.0, 2.0]",
        b"not json",
        b"\xff\xfe",
    ],
)
def test_malformed_answers_are_retried_then_raise(body: bytes) -> None:
    with canned_server(body) as (url, hits):
        reward = RemoteReward(url, max_retries=1, backoff_s=0.0)
        with pytest.raises(RewardFailure, match="malformed answer"):
            reward.score(["a", "b"], ["c", "d"])
        assert len(hits) == 2


def test_a_valid_canned_answer_is_read_exactly() -> None:
    with canned_server(b'{"rewards": [3, -0.25], "extra": "ignored"}') as (url, hits):
        rewards = RemoteReward(url).score(["a", "b"], ["c", "d"])[0]
    assert rewards == [3.0, -0.25]
    assert all(type(r) is float for r in rewards)
    assert len(hits) == 1


def test_client_errors_are_not_retried() -> None:
    with RewardServer(length_gain) as server:
        wrong_path = server.url.removesuffix("/score") + "/nope"
        reward = RemoteReward(wrong_path, max_retries=3, backoff_s=0.0)
        with pytest.raises(RewardFailure, match="HTTP 404") as info:
            reward.score(PROMPTS, RESPONSES)
        assert server.requests == 1
    assert "1 attempt" in str(info.value)


def test_nothing_listening_is_an_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/score"
    reward = RemoteReward(url, timeout_s=0.5, max_retries=1, backoff_s=0.0)
    with pytest.raises(RewardFailure, match="connection failed") as info:
        reward.score(PROMPTS, RESPONSES)
    assert url in str(info.value) and "2 attempts" in str(info.value)


def test_server_answers_a_bad_body_with_400_and_a_json_error() -> None:
    with RewardServer(length_gain) as server:
        for body in (b"{", b'{"prompts": ["a"], "responses": []}', b'{"prompts": [1]}'):
            request = urllib.request.Request(server.url, data=body, method="POST")
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(request, timeout=2)
            assert info.value.code == 400
            assert "error" in json.loads(info.value.read())


def test_empty_batch_sends_nothing() -> None:
    with RewardServer(length_gain) as server:
        assert RemoteReward(server.url).score([], []) == ([], 0)
        assert server.requests == 0


def test_mismatched_batch_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="2 prompts and 1 responses"):
        RemoteReward("http://127.0.0.1:1/score").score(["a", "b"], ["c"])


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"url": "ftp://x"}, "ftp://x"),
        ({"url": "http://"}, "http://"),
        ({"url": "127.0.0.1:8000/score"}, "127.0.0.1:8000/score"),
        ({"url": "http://host:port/score"}, "http://host:port/score"),
        ({"url": "http://127.0.0.1:1/score", "timeout_s": 0}, "timeout_s=0"),
        ({"url": "http://127.0.0.1:1/score", "timeout_s": float("nan")}, "timeout_s=nan"),
        ({"url": "http://127.0.0.1:1/score", "max_retries": -1}, "max_retries=-1"),
        ({"url": "http://127.0.0.1:1/score", "max_retries": 1.5}, "max_retries=1.5"),
        ({"url": "http://127.0.0.1:1/score", "backoff_s": -0.1}, "backoff_s=-0.1"),
    ],
)
def test_bad_settings_raise_value_error_naming_the_value(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        RemoteReward(**kwargs)


def test_bad_url_message_gives_an_example() -> None:
    with pytest.raises(ValueError, match=re.escape("http://127.0.0.1:8000/score")):
        RemoteReward("ftp://x")


def test_pickle_round_trip_keeps_settings_and_still_scores() -> None:
    with RewardServer(length_gain) as server:
        original = RemoteReward(server.url, timeout_s=2.5, max_retries=4, backoff_s=0.01)
        copy = pickle.loads(pickle.dumps(original))
        assert copy == original
        assert copy.score(PROMPTS, RESPONSES) == original.score(PROMPTS, RESPONSES)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--reward", "no_such_module_for_nobubble:fn"], "no_such_module_for_nobubble"),
        (["--reward", "math:pi"], "math:pi"),  # exists, but is not a function
        (["--reward", "no-colon"], "no-colon"),
        (["--task", "digits", "--port", "70000"], "70000"),
        (["--task", "nope"], "nope"),
        ([], "--reward"),
    ],
)
def test_main_with_bad_arguments_returns_2_with_one_line(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = cli_main(["rl", "reward-server", *argv])
    except SystemExit as stop:  # argparse's own usage errors
        rc = stop.code
    assert rc == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert named in captured.err
    assert captured.err.count("\n") == 1
