"""An earlier version's `state.json` is imported on the first start with the store: the
zones and the yield it held are held again (their backends kept down), and the file is
renamed `state.json.migrated`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.api.test_state_behind import Rig, served
from tests.fakes.servers import until_backend
from tests.fakes.state import saved_sections


async def test_zones_and_the_yield_of_a_state_json_survive_the_move(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        assert await served(gw) == 200
        held = await gw.client.post("/vram/zones/img/acquire", json={"mib": 100, "holder": "ui"})
        assert held.status_code == 200, held.text
        taken = await gw.client.post("/vram/yield", json={"reason": "game"})
        assert taken.json()["stopped"] == ["lazy"]
    # The same sections as the JSON file of earlier versions wrote them.
    sections = saved_sections(rig.state_dir)
    assert {z["name"] for z in sections["zones"]} == {"img", "yield"}
    shutil.rmtree(rig.state_dir)
    rig.state_dir.mkdir()
    old = {**sections, "version": 1}
    (rig.state_dir / "state.json").write_text(json.dumps(old, indent=2), encoding="utf-8")

    async with rig.gateway() as gw:
        yielded = (await gw.client.get("/vram/yield")).json()
        assert (yielded["state"], yielded["reason"]) == ("yielded", "game")
        zones = (await gw.client.get("/vram/zones")).json()["zones"]
        assert sorted(z["zone"] for z in zones) == ["img", "yield"]
        assert (await until_backend(gw, "lazy", state="stopped"))["blocked_by"]
        assert rig.runtime.starts == 0
    assert not (rig.state_dir / "state.json").exists()
    assert json.loads((rig.state_dir / "state.json.migrated").read_text()) == old
    assert {z["name"] for z in saved_sections(rig.state_dir)["zones"]} == {"img", "yield"}
