"""docker-compose.yml's header names every request deploy/docker-socket-proxy/haproxy.cfg
lets through, so a reader of the compose file knows what the gateway may do to Docker.
(What the proxy really allows and denies is tested against Docker in
tests/e2e/test_docker_proxy.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ALLOW = re.compile(r"http-request allow if \{ method [A-Z ]+ \} (\w+)")
# The word the header uses for each of the proxy's allowed acls.
WORDS = {
    "ping": "ping",
    "version": "version",
    "events": "events",
    "container_list": "list",
    "container_json": "inspect",
    "container_start": "start",
    "container_stop": "stop",
    "container_logs": "logs",
}


def allowed() -> list[str]:
    """The acls of haproxy.cfg's allow rules."""
    text = (ROOT / "deploy/docker-socket-proxy/haproxy.cfg").read_text(encoding="utf-8")
    return ALLOW.findall(text)


def header_sentence() -> str:
    """The compose header's sentence about the proxy, its comment marks taken out."""
    lines = (ROOT / "docker-compose.yml").read_text(encoding="utf-8").split("\nservices:")[0]
    text = " ".join(line.lstrip("# ") for line in lines.splitlines())
    return text[text.index("lets through only") :].split(".")[0]


def test_the_allow_rules_are_read() -> None:
    assert allowed()[:3] == ["ping", "version", "events"]
    assert "container_logs" in allowed()


def test_the_compose_header_names_every_allowed_request() -> None:
    sentence = header_sentence()
    unnamed = [acl for acl in allowed() if not re.search(rf"\b{WORDS[acl]}\b", sentence)]
    assert unnamed == [], f"docker-compose.yml's header leaves out {unnamed}: {sentence!r}"
