"""A plain HTTP client for the emulator tests, following 307s the way the product must.

``requests`` drops ``Authorization`` on a redirect to another host:port (the FE -> BE hop), so ``send``
follows 307s by hand and re-sends auth and body (docs/protocol.md, "Common: redirects"), keeping every hop
for the tests to check.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Exchange:
    """The final response of a request and every hop it took (307s included)."""

    response: Any  # requests.Response
    hops: list[Any]

    @property
    def json(self) -> Any:
        return self.response.json()

    @property
    def redirected(self) -> bool:
        return len(self.hops) > 1


def send(method: str, url: str, *, auth: tuple[str, str] | None = ("root", ""),
         headers: dict[str, str] | None = None, data: Any = b"", follow: bool = True,
         timeout: float = 10.0, max_hops: int = 3) -> Exchange:
    """Send with ``requests``, following 307s by hand and re-sending auth and body (Common: redirects).

    ``requests`` would drop ``Authorization`` on the FE->BE hop (docs/protocol.md, Common: redirects).
    """
    import requests  # imported lazily: the emulators themselves need only the stdlib

    hops = []
    for _ in range(max_hops):
        resp = requests.request(method, url, auth=auth, headers=headers or {}, data=data,
                                allow_redirects=False, timeout=timeout)
        hops.append(resp)
        if not follow or resp.status_code != 307:
            return Exchange(resp, hops)
        url = resp.headers["Location"]
    raise RuntimeError(f"too many redirects: {[h.url for h in hops]}")
