"""`GET /openapi.json` describes the routes the gateway really has, `/v1/*` included."""

from __future__ import annotations

from app.api.protocol import PROXIED
from app.main import create_app
from tests.fakes.servers import gateway, gateway_settings

SETTINGS = gateway_settings({"m": {"url": "http://127.0.0.1:9", "models": ["m"]}})


async def test_the_schema_lists_every_relayed_route_with_its_envelopes() -> None:
    async with gateway(SETTINGS) as gw:
        response = await gw.client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    for endpoint in PROXIED:
        post = paths[endpoint.path]["post"]
        media = "multipart/form-data" if endpoint.form else "application/json"
        body = post["requestBody"]["content"][media]["schema"]
        assert "model" in body["required"]
        if endpoint.instead:  # either form: `input` or vLLM's chat `messages`
            assert body["anyOf"] == [
                {"required": [endpoint.required]},
                {"required": [endpoint.instead]},
            ]
        elif endpoint.required:
            assert endpoint.required in body["required"]
        error = post["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
        assert error.endswith("/ErrorEnvelope")
    messages = paths["/v1/messages"]["post"]["responses"]["4XX"]
    assert messages["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AnthropicErrorEnvelope"
    )
    for path in ("/v1/models", "/v1/models/{model}", "/v1/responses/{response_id}"):
        assert "get" in paths[path]
    # FastAPI's 422 is never sent (an unreadable body is a 400 in the gateway's envelope).
    for item in paths.values():
        for operation in item.values():
            assert "422" not in operation["responses"]


def test_the_schema_is_built_once() -> None:
    app = create_app(SETTINGS)
    assert app.openapi() is app.openapi()
