"""The frontend's keys. The API key (optional) guards every API request: `Authorization: Bearer <key>`,
read from a file or $RAGSTACK_OPENAI_API_KEY, never from a command line (where any local user could read
it). The admin key ($RAGSTACK_ADMIN_KEY, as for Triton's repository API) guards model load and unload."""
from __future__ import annotations

import hmac
import os
from pathlib import Path

from ragstack import admin_key
from ragstack.openai_frontend.errors import APIError

ENV = "RAGSTACK_OPENAI_API_KEY"


def api_key(file: Path | None) -> str | None:
    """The key in `file` if given, else $RAGSTACK_OPENAI_API_KEY (unset or empty: None, the API is open).
    Either is stripped (a file's or a Secret's trailing newline) and must then be one word."""
    if file is None:
        value, source = os.environ.get(ENV), f"${ENV}"
        if not value:
            return None
    else:
        value, source = Path(file).read_text(), f"the API key file {file}"
    key = value.strip()
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"{source} must hold one key, without spaces")
    return key


def _same(given: str, key: str) -> bool:
    return hmac.compare_digest(given.encode(), key.encode())


def check_bearer(authorization: str, key: str | None) -> None:
    if key is None:
        return
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not _same(token.strip(), key):
        raise APIError(401, "missing or wrong API key: send it as 'Authorization: Bearer <key>'",
                       code="invalid_api_key")


def check_admin(given: str, key: str | None) -> None:
    if key is None:
        raise APIError(403, f"loading and unloading models needs the admin key, and this frontend has none (set "
                            f"${admin_key.ENV} where it runs)", code="permission_denied")
    if not _same(given, key):
        raise APIError(403, f"loading and unloading models needs the admin key in the header '{admin_key.HEADER}'",
                       code="permission_denied")
