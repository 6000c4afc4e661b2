"""Admin bodies are read as JSON whatever content-type they carry: `curl -d '{...}'`
(labelled as a form) works as docs/gpu.md prints it; bad bodies get the API's error."""

from __future__ import annotations

from app.settings import Settings
from tests.fakes.processes import free_port
from tests.fakes.servers import gateway, gateway_settings

FORM = {"content-type": "application/x-www-form-urlencoded"}  # what curl -d sends


def settings() -> Settings:
    return gateway_settings({"b": {"url": f"http://127.0.0.1:{free_port()}", "models": ["m"]}})


async def test_a_yield_posted_as_curl_does_is_taken_and_restored() -> None:
    async with gateway(settings()) as gw:
        taken = await gw.client.post(
            "/vram/yield", content=b'{"reason": "gaming", "ttl_s": 60}', headers=FORM
        )
        assert taken.status_code == 200, taken.text
        assert (taken.json()["state"], taken.json()["reason"]) == ("yielded", "gaming")
        restored = await gw.client.post("/vram/restore", headers=FORM)
        assert restored.json()["restored"] is True


async def test_bad_admin_bodies_get_a_clear_400() -> None:
    async with gateway(settings()) as gw:
        broken = await gw.client.post("/vram/yield", content=b"{nope", headers=FORM)
        assert broken.status_code == 400
        assert broken.json()["error"]["code"] == "invalid_json"
        wrong = await gw.client.post("/vram/yield", json={"ttl_s": -1})
        assert wrong.status_code == 400
        assert wrong.json()["error"]["param"] == "ttl_s"
        assert "ttl_s" in wrong.json()["error"]["message"]
        missing = await gw.client.post("/vram/zones/img/acquire", content=b"")
        assert missing.status_code == 400
        assert "mib and holder" in missing.json()["error"]["message"]
        assert (await gw.client.get("/vram/yield")).json() == {"state": "none", "host": "local"}
