"""HTTP for calls that carry a bearer token (the ServiceAccount's, which can suspend jobs):
never over plain http, never after a redirect.

``urllib`` follows redirects by default and keeps the ``Authorization`` header of a
``Request`` on the next hop, wherever it points: one 302 from a compromised or spoofed
server would hand the token to any host. These helpers refuse both.
"""

from __future__ import annotations

import ssl
import urllib.request
from typing import Any
from urllib.parse import urlsplit


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        # None makes urllib raise HTTPError with the 3xx status instead of following it.
        return None


def opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener that verifies TLS (with ``context``, else the system's CAs) and follows
    no redirect: a 3xx comes back as ``urllib.error.HTTPError``."""
    return urllib.request.build_opener(_NoRedirect(),
                                       urllib.request.HTTPSHandler(context=context))


def require_https(url: str, headers: dict[str, str], what: str) -> None:
    """Raise ``ValueError`` when ``headers`` carry a token and ``url`` is not https."""
    if "Authorization" in headers and urlsplit(url).scheme.lower() != "https":
        raise ValueError(f"{what}: {url}: a bearer token is only ever sent over https "
                         "(use the https URL of the service, and ca_file for its CA)")
