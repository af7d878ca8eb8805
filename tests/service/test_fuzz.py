"""Property-based fuzzing of the API from its own OpenAPI spec (schemathesis).

Every operation gets generated valid and invalid inputs: no 5xx, responses match the
documented schema and status codes, invalid input is rejected with a 4xx; mutating
operations without the token get 401 whatever the body.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from seamguard.app.service.access import allowed_hosts
from seamguard.app.service.api import create_app
from seamguard.app.runner import Runner
from seamguard.app.sources import TwinSource

from .conftest import TOKEN



@pytest.fixture(scope="module")
def fuzz_runner():
    r = Runner(TwinSource(gpus=256, minutes=6.0, seed=3), speed=0)
    r.advance(40)
    r.start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_runner):
    # schemathesis's ASGI client sends `Host: testserver`: a name the service is told to answer to
    return schemathesis.openapi.from_asgi("/openapi.json",
                                          create_app(fuzz_runner, TOKEN, allowed_hosts("127.0.0.1", ["testserver"])))


schema = schemathesis.pytest.from_fixture("api_schema")

CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.negative_data_rejection]


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_from_spec(case):
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS)


@schema.include(method=["PUT", "POST", "DELETE"]).parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_mutations_without_token_get_401(case):
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    if case.method.upper() != case.operation.method.upper():
        return  # schemathesis also probes unsupported methods; those get 405 and change nothing
    resp = case.call()
    # The token is checked before the body and parameters are parsed: always 401.
    assert resp.status_code == 401, (case.method, case.formatted_path, resp.status_code, resp.text)
    assert resp.headers.get("www-authenticate") == ["Bearer"] or resp.headers.get("www-authenticate") == "Bearer"
