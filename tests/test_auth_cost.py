"""Wrong basic-auth passwords cost bounded CPU, and a check costs the same for any user name.

Timing is checked structurally, not with a clock: bcrypt's two entry points are wrapped to record each
computation and the cost (log2 rounds) of the hash it ran at, and how many ran at once.
"""

from __future__ import annotations

import base64
import threading

import bcrypt
import pytest

from sglang_oom_exporter.web import webconfig
from sglang_oom_exporter.web.webconfig import BasicAuth

_HASHPW, _GENSALT = bcrypt.hashpw, bcrypt.gensalt  # the tests' own hashing is not counted
COST = 6  # not the old fixed dummy's 10: an unknown user must be checked at the configured users' cost


def _hash(password: bytes, cost: int = COST) -> str:
    return _HASHPW(password, _GENSALT(rounds=cost)).decode().replace("$2b$", "$2y$")


def _header(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


def _cost(hashed_or_salt: bytes) -> int:
    return int(hashed_or_salt.split(b"$")[2])


@pytest.fixture
def bcrypt_calls(monkeypatch):
    """Every bcrypt computation the checks make, as (function, cost); and the most that ran at once."""
    calls: list[tuple[str, int]] = []
    state = {"now": 0, "most": 0}
    lock = threading.Lock()
    real_check, real_hash = bcrypt.checkpw, bcrypt.hashpw

    def wrap(name, real):
        def run(password, hashed):
            with lock:
                calls.append((name, _cost(hashed)))
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            try:
                return real(password, hashed)
            finally:
                with lock:
                    state["now"] -= 1

        return run

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", wrap("checkpw", real_check))
    monkeypatch.setattr(webconfig.bcrypt, "hashpw", wrap("hashpw", real_hash))
    return calls, state


def test_a_known_and_an_unknown_user_each_cost_one_bcrypt_at_the_configured_cost(bcrypt_calls):
    calls, _ = bcrypt_calls
    auth = BasicAuth({"alice": _hash(b"s3cret")})
    per_request = []
    for user, password in [("alice", b"wrong-1"), ("mallory", b"wrong-2"), ("alice", b"wrong-3"), ("eve", b"x")]:
        before = len(calls)
        assert not auth.check(_header(user, password))
        per_request.append([cost for _, cost in calls[before:]])
    # One computation per request at the same cost, whether the user exists or not (was: unknown users at 10).
    assert per_request == [[COST], [COST], [COST], [COST]]


def test_unknown_users_are_checked_at_the_highest_configured_cost(bcrypt_calls):
    calls, _ = bcrypt_calls
    auth = BasicAuth({"alice": _hash(b"a", 4), "bob": _hash(b"b", 7)})
    for n in range(3):
        assert not auth.check(_header(f"nobody{n}", b"pw"))
    assert [cost for _, cost in calls] == [7, 7, 7]


def test_a_stale_password_costs_one_check_not_one_per_scrape(bcrypt_calls):
    calls, _ = bcrypt_calls
    auth = BasicAuth({"alice": _hash(b"s3cret")})
    for _ in range(50):
        assert not auth.check(_header("alice", b"old-password"))
        assert not auth.check(_header("mallory", b"guess"))
        assert auth.check(_header("alice", b"s3cret"))
    assert len(calls) == 3  # was 100: every wrong password ran bcrypt again


def test_bcrypt_runs_one_check_at_a_time(bcrypt_calls):
    calls, state = bcrypt_calls
    auth = BasicAuth({"alice": _hash(b"s3cret", 8)})
    results: list[bool] = []

    def client(n: int) -> None:
        for i in range(3):
            results.append(auth.check(_header("alice", f"wrong-{n}-{i}".encode())))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [False] * 24
    assert len(calls) == 24
    assert state["most"] == 1  # bcrypt releases the GIL: without the limit, two clients take both cores


def test_a_flood_of_wrong_passwords_does_not_evict_a_good_credential(bcrypt_calls, monkeypatch):
    calls, _ = bcrypt_calls
    monkeypatch.setattr(webconfig, "_CACHE_LIMIT", 40)  # 1,024 in use: the same code, fewer bcrypt runs here
    auth = BasicAuth({"alice": _hash(b"s3cret", 4)})
    assert auth.check(_header("alice", b"s3cret"))
    for n in range(100):  # more than the failure cache holds
        assert not auth.check(_header("alice", f"guess-{n}".encode()))
    before = len(calls)
    assert auth.check(_header("alice", b"s3cret"))
    assert len(calls) == before
