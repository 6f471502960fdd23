"""The OpenAI frontend's model configs: fetched again in the background while requests ask for them, so a
request finds its model's config cached even after an idle spell longer than CONFIG_CACHE_S; the refresh
stops once no request has asked for KEEP_FRESH_S. Triton is a stand-in here (the timings are scaled down);
the frontend against the real server: tests/server/test_openai_*."""
from __future__ import annotations

import asyncio

from ragstack.openai_frontend import triton
from tritonclient.utils import InferenceServerException

CONFIG = {"name": "llm", "backend": "triton_llm"}


class Configs:
    """tritonclient's get_model_config for one loaded model, counting its calls."""

    def __init__(self):
        self.calls = 0

    async def get_model_config(self, model: str, as_json: bool = False):
        self.calls += 1
        if model != "llm":
            raise InferenceServerException("Request for unknown model", status="StatusCode.NOT_FOUND")
        return {"config": CONFIG}

    async def close(self):
        pass


def test_a_served_models_config_stays_fresh_in_the_background_until_no_request_asks(monkeypatch):
    monkeypatch.setattr(triton, "CONFIG_CACHE_S", 0.1)
    monkeypatch.setattr(triton, "REFRESH_S", 0.02)
    monkeypatch.setattr(triton, "KEEP_FRESH_S", 0.3)

    async def scenario():
        client = triton.Triton("127.0.0.1:1", None)
        configs = Configs()
        monkeypatch.setattr(client, "_client", configs)
        assert await client.config("llm") == CONFIG and configs.calls == 1
        await asyncio.sleep(0.15)  # idle past CONFIG_CACHE_S: refreshed meanwhile
        refreshed = configs.calls
        assert refreshed > 2
        assert await client.config("llm") == CONFIG and configs.calls == refreshed  # no fetch on the request
        assert await client.config("nope") is None  # an unknown name is fetched, not kept fresh
        await asyncio.sleep(0.5)  # no request for KEEP_FRESH_S: the refresh stops
        assert client._refresher.done()
        stopped = configs.calls
        await asyncio.sleep(0.1)
        assert configs.calls == stopped
        await client.close()

    asyncio.run(scenario())
