"""What a backend serves, and how long a request it takes: configured, or learned from the
server when it becomes ready, remembered across gateway restarts.

`Served.apis` is the one answer the data plane asks (`Backend.serving`), in this order
(`app.settings.endpoints`): `endpoints:` when listed; else the APIs of the routes the
server's `/openapi.json` listed (`Learned.routes`); else vLLM's set for `task:`, else for
`runner:`. `max_model_len` is the server's, from its `/v1/models`; None until learned.

What was learned is saved in the state file's `learned` section (`LearnedRecords`), with
the backend's URL and model, so a lazy backend that has not been started since the gateway
restarted is routed by what its server said last time; a record for another URL or model
is ignored. Pure but for the store it is given.
"""

from __future__ import annotations

import logging
from typing import Final, Literal

from app.lifecycle.store import StateStore
from app.settings import BackendConfig
from app.settings.endpoints import Api, apis_of_paths, with_messages
from app.upstreams.vllm_learned import Learned

logger = logging.getLogger(__name__)

LEARNED: Final = "learned"  # the state file's section
Source = Literal["endpoints", "openapi", "task", "runner"]


class Served:
    """One backend's answer to "what does it serve" (see the module docstring). `name`
    and `records`: where what its server says is saved, and read back at start."""

    __slots__ = ("_config", "_name", "_records", "apis", "learned", "source")

    def __init__(
        self,
        config: BackendConfig,
        learned: Learned | None = None,
        *,
        name: str = "",
        records: LearnedRecords | None = None,
    ) -> None:
        self._config = config
        self._name = name
        self._records = records
        if learned is None and records is not None:
            learned = records.get(name, config)
        self.learned = learned
        self.apis, self.source = self._resolve()

    def _resolve(self) -> tuple[frozenset[Api], Source]:
        config, learned = self._config, self.learned
        if config.endpoints is not None:
            return frozenset(config.endpoints), "endpoints"
        paths = None if learned is None else learned.paths
        if paths is not None:
            return with_messages(apis_of_paths(paths), config.messages), "openapi"
        return config.apis, "task" if config.task is not None else "runner"

    def take(self, learned: Learned) -> None:
        """What its server just said: kept, logged and saved when it changed anything."""
        if not self.learn(learned):
            return
        logger.info("learned what it serves backend=%s source=%s apis=%s max_model_len=%s",
                    self._name, self.source, ",".join(sorted(self.apis)),
                    learned.max_model_len)  # fmt: skip
        if self._records is not None:
            self._records.put(self._name, self._config, learned)

    def learn(self, learned: Learned) -> bool:
        """Take what the server said; True when it changed anything."""
        if learned == self.learned:
            return False
        self.learned = learned
        self.apis, self.source = self._resolve()
        return True

    def serves(self, api: Api) -> bool:
        return api in self.apis

    @property
    def max_model_len(self) -> int | None:
        return None if self.learned is None else self.learned.max_model_len

    def serves_route(self, method: str, path: str) -> bool | None:
        """Whether the server has the route `method path` (a concrete path); None when its
        routes are not known (docs off, never learned)."""
        return None if self.learned is None else self.learned.serves_route(method, path)

    def methods_of(self, path: str) -> list[str]:
        """The methods its server has at `path` (empty: none, or not known)."""
        return [] if self.learned is None else self.learned.methods_of(path)


class LearnedRecords:
    """The `learned` section: per backend, what its server said, with the URL and model it
    was said for. Written with `StateStore.put` (a failed write is kept in memory and
    retried: routing goes on by what is in memory)."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def get(self, name: str, config: BackendConfig) -> Learned | None:
        raw = self._store.section(LEARNED, {})
        entry = raw.get(name) if isinstance(raw, dict) else None
        if not isinstance(entry, dict):
            return None
        if entry.get("url") != config.url or entry.get("model") != config.served_model:
            return None  # said by another server: the configuration changed since
        learned = Learned.from_json(entry)
        if learned is None:
            logger.warning("learned routes unreadable, ignored backend=%s", name)
        return learned

    def put(self, name: str, config: BackendConfig, learned: Learned) -> None:
        raw = self._store.section(LEARNED, {})
        section = dict(raw) if isinstance(raw, dict) else {}
        section[name] = {"url": config.url, "model": config.served_model, **learned.to_json()}
        self._store.put(LEARNED, section)
