"""Which inference instances serve a request: the routing seam of the gateway.

The gateway (seamguard.gateway.app) asks a Router for a Route before it proxies a request and
tells it the Outcome afterwards. For disaggregated serving a Route names a prefill instance and
a decode instance, and so the KV-cache transfer path between them; for unified instances
``prefill`` is None. Routers are plain objects with no I/O: the gateway feeds them what it
measured and what the control plane says about links and NICs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal, Protocol

Role = Literal["prefill", "decode", "unified"]
RequestClass = Literal["interactive", "batch"]


@dataclass(frozen=True)
class Instance:
    """One inference server the gateway may send work to."""

    name: str
    url: str  # base URL of its OpenAI-compatible API, e.g. http://10.0.0.2:8000
    role: Role = "unified"
    nic: str | None = None  # the NIC/link id the control plane knows it by (link and NIC states)


@dataclass(frozen=True)
class Route:
    """Where one request goes, and why when that is not the default choice."""

    decode: Instance  # the instance that streams the tokens (the only one for unified serving)
    prefill: Instance | None = None  # disaggregated serving: where the prompt is prefilled
    reason: str = ""  # empty for the default choice; evidence in words otherwise
    evidence: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What the gateway measured for one routed request."""

    ok: bool
    ttft_s: float | None = None  # request received -> first token sent to the client
    tpot_s: float | None = None  # mean time per output token after the first
    decode_first_token_s: float | None = None  # decode request sent -> its first token (includes the KV transfer)
    output_tokens: int = 0


class Router(Protocol):
    def route(self, request_class: RequestClass, prompt_tokens: int) -> Route: ...

    def finished(self, route: Route, outcome: Outcome) -> None: ...


class RoundRobin:
    """Each role's instances in turn; prefill and decode cycle independently."""

    def __init__(self, instances: list[Instance]) -> None:
        prefill = [i for i in instances if i.role == "prefill"]
        decode = [i for i in instances if i.role in ("decode", "unified")]
        if not decode:
            raise ValueError("routing: no decode or unified instance configured")
        if prefill and any(i.role == "unified" for i in decode):
            raise ValueError("routing: mix of prefill and unified instances; use prefill+decode or unified only")
        self._prefill = itertools.cycle(prefill) if prefill else None
        self._decode = itertools.cycle(decode)

    def route(self, request_class: RequestClass, prompt_tokens: int) -> Route:
        return Route(decode=next(self._decode), prefill=next(self._prefill) if self._prefill else None)

    def finished(self, route: Route, outcome: Outcome) -> None:
        pass
