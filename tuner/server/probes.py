"""The lifecycle's HTTP probes of a server: `/health`'s status, `/get_server_info`'s JSON.

Plain urllib (no event loop: the lifecycle polls between other host commands), the API key
as a bearer token, every call under its own timeout.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def _request(url: str, api_key: str | None) -> urllib.request.Request:
    req = urllib.request.Request(url)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    return req


def http_status(url: str, api_key: str | None, timeout_s: float) -> int | None:
    """The HTTP status `url` answers with, or None when nothing answered in time."""
    try:
        with urllib.request.urlopen(_request(url, api_key), timeout=timeout_s) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):  # refused, reset, timed out: not up (yet)
        return None


def server_info(base_url: str, api_key: str | None, timeout_s: float) -> dict[str, Any] | None:
    """What the server reports of itself (SGLang's /get_server_info, older /server_info)."""
    for path in ("/get_server_info", "/server_info"):
        try:
            with urllib.request.urlopen(_request(base_url + path, api_key), timeout=timeout_s) as r:
                data = json.loads(r.read())
            if isinstance(data, dict):
                return data
        except (OSError, ValueError):
            continue
    return None
