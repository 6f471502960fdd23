"""What every handler needs: Triton, the limits, and the keys."""
from __future__ import annotations

from dataclasses import dataclass

from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.openai_frontend.triton import Triton


@dataclass
class Frontend:
    triton: Triton
    limits: FrontendLimits
    api_key: str | None      # set: every API request must carry it as a bearer token
    admin_key: str | None    # set: model load and unload need it (x-ragstack-admin-key)
