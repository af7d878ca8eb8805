"""The runtime's etcd client turns a refused call into one StoreError line, whatever the
error's message (an empty one included), without trying the other endpoints."""

from __future__ import annotations

import pytest

from seamguard.runtime import etcd_client
from seamguard.runtime.etcd_client import Endpoints, StoreError


class _Client:
    async def connect(self) -> None:
        return None


@pytest.mark.parametrize("message", ["", "permission denied\nsecond line"])
def test_a_refused_call_is_one_store_error_line(monkeypatch, message):
    monkeypatch.setattr(etcd_client, "connect", lambda endpoint, timeout_s: _Client())
    calls = []

    async def refused(client):
        calls.append(client)
        raise ValueError(message)

    ep = Endpoints((("127.0.0.1", 1), ("127.0.0.1", 2)), request_timeout_s=2.0)
    try:
        with pytest.raises(StoreError) as err:
            ep.call("put", refused)
    finally:
        ep.close()
    assert len(calls) == 1
    assert "\n" not in str(err.value) and str(err.value).startswith("etcd put: ValueError:")
