"""A backend's memory (`Backend.memory`): what it holds, on its GPUs and (asleep) in host RAM.

- Where: `gpus`, the GPUs it is placed on (its `gpus:` list; chosen at each start with
  `gpus: auto` or a count: `place`, by admission, which says why in `placed_why`), until
  its next start places it again (a wake stays where it sleeps).
- On its GPUs: `footprint` (what admission counts: `vram_mib`, a GPU profile's share, or
  the planner's estimate; the supervisor keeps it current, `plan`), `measured_mib` (what
  the probe saw its last start take), and while asleep `asleep_mib` and `asleep_level`.
- How it gives memory back: its `yield:` (a GPU profile may override the method) and
  whether its server has sleep mode; the choice itself is its host's RAM book's
  (`app.lifecycle.release`).
- In host RAM asleep at level 1: its weights (`ram_charge`), as vLLM said it loaded
  them, else as the planner or `vram_mib` estimates.

- Its sleeps since its last cold start (`sleeps`, `record_sleep`): what each freed and
  kept, for the sleep guard (`app.lifecycle.sleep_guard`).

Its backend is the one writer (`admitted`, `slept`, `found_asleep`, `released`,
`releasing`, `record_sleep`: its start, sleep and stop); it reads the backend's state and
config (`Stateful`).
"""

from __future__ import annotations

from typing import Final

from app.lifecycle import admission as rules
from app.lifecycle.release import ram_charge
from app.lifecycle.sleep_guard import Leak, SleepHistory, leak_of
from app.lifecycle.state import BackendState, Stateful
from app.planner.footprint import Footprint
from app.settings import ReleaseConfig

# `placed_why` of a backend chosen at each start before its first start placed it.
NOT_PLACED: Final = "not placed yet"


class Memory:
    def __init__(self, backend: Stateful) -> None:
        self._backend = backend
        config = backend.config
        self.holds_vram = False  # admitted and not yet stopped: counted on its GPUs
        # Where it is (or was last, or goes first: without admission, the first N GPUs).
        self.gpus: tuple[int, ...] = config.first_gpus
        self.placed_why = "gpus: in its config" if config.fixed_gpus else NOT_PLACED
        # What admission counts for it: `vram_mib`, else the active profile's share, else
        # the planner's estimate from its model description (the supervisor keeps it current).
        self._footprint: Footprint | None = (
            None if config.vram_mib is None else Footprint(config.vram_mib, "vram_mib")
        )
        # GPU memory used after its last start minus before it, as the probe saw it (starts
        # on a GPU are one at a time, so the difference is this backend's).
        self._measured_mib: int | None = None
        # Asleep: MiB per GPU it still holds (None: awake, or counted whole; see `rules`).
        self._asleep_mib: int | None = None
        # What its last sleep the probe measured kept (None: none measured yet): counted
        # for a sleep the GPU's reading cannot measure (`kept_asleep`).
        self._measured_kept_mib: int | None = None
        # Asleep: the level it slept at, which its wake needs (None: not known, or awake).
        self._asleep_level: int | None = None
        # What its weights took on its GPUs when it last loaded, as vLLM said it ("Model
        # loading took X GiB", summed over its GPUs); None: not seen.
        self._loaded_weights_bytes: int | None = None
        # The level of the sleep its stop task is going to (None: a stop, or no task).
        self._releasing_level: int | None = None
        # How a yield frees its memory; a GPU profile may override the config.
        self._yield_method_override: str | None = None
        # Its sleeps since its last cold start, for the sleep guard (app.lifecycle.sleep_guard).
        self.sleeps = SleepHistory()

    def place(self, gpus: tuple[int, ...], why: str) -> None:
        """Admission put its start on `gpus` (`why`: "GPU 1: 18.2 GiB free, pack")."""
        self.gpus, self.placed_why = gpus, why

    def admitted(self) -> int | None:
        """Its start or wake was admitted: counted on its GPUs, its whole footprint again;
        the level it slept at (what a wake needs), forgotten here."""
        self.holds_vram = True
        level, self._asleep_mib, self._asleep_level = self._asleep_level, None, None
        return level

    def slept(self, kept: int | None, level: int) -> None:
        self._asleep_mib, self._asleep_level = kept, level

    def found_asleep(self, level: int | None) -> None:
        """At gateway start: its server was found asleep (at `level`: None, not known)."""
        self.holds_vram = True
        self._asleep_mib = rules.asleep_mib(self.vram_mib, None, self._backend.config.asleep_mib)
        self._asleep_level = level

    def released(self, *, holds_vram: bool = False) -> None:
        """Stopped or failed: nothing held (`holds_vram`: a server that may still hold it)."""
        self.holds_vram = holds_vram
        if not holds_vram:
            self._asleep_mib = self._asleep_level = None

    def releasing(self, level: int | None) -> None:
        """Its stop task begins: to sleep at `level`, or (None) to stop."""
        self._releasing_level = level

    @property
    def vram_mib(self) -> int | None:
        """MiB it holds on each of its GPUs, for admission; None: not checked."""
        return None if self._footprint is None else self._footprint.mib

    @property
    def footprint(self) -> Footprint | None:
        return self._footprint

    def plan(self, footprint: Footprint | None) -> None:
        """Admission counts `footprint` from the next start on (None: not checked)."""
        self._footprint = footprint

    @property
    def asleep_mib(self) -> int | None:
        """While asleep: the MiB per GPU admission counts for it (None: its footprint)."""
        return self._asleep_mib

    @property
    def asleep_level(self) -> int | None:
        """While asleep: the level it slept at (None: not known, e.g. found asleep)."""
        return self._asleep_level

    def kept_asleep(self, freed_mib: int | None) -> int | None:
        """What it holds asleep after a sleep the probe saw free `freed_mib` (None: not
        measured), by `app.lifecycle.admission.asleep_mib`; a measured sleep's is
        remembered for a later one that cannot be measured (its GPU was full)."""
        kept = rules.asleep_mib(
            self.vram_mib, freed_mib, self._backend.config.asleep_mib, self._measured_kept_mib
        )
        if freed_mib is not None and freed_mib > 0:
            self._measured_kept_mib = kept
        return kept

    def record_sleep(
        self, level: int, freed_mib: int | None, kept: int | None, at: float
    ) -> Leak | None:
        """A sleep that freed `freed_mib` (None: not measured) and keeps `kept` (as
        `kept_asleep` counts it), recorded; the leak it shows against its first measured
        sleep since the cold start, past its `sleep_leak_mib` (None: none)."""
        cycle = self.sleeps.record(level=level, freed_mib=freed_mib, held_mib=kept, at=at)
        return leak_of(self.sleeps.baseline, cycle, self._backend.config.sleep_leak_mib)

    @property
    def counted_mib(self) -> int | None:
        """MiB per GPU admission counts for it while it holds memory."""
        return self.vram_mib if self._asleep_mib is None else self._asleep_mib

    @property
    def held_mib(self) -> int | None:
        """MiB per GPU it holds now (None: none), the one number `ps`, `status` and the
        automatic yield's foreign memory use: asleep, what it kept (as counted); else
        what its last start measured, else what admission counts."""
        if not self.holds_vram:
            return None
        if self._backend.state is BackendState.SLEEPING:
            return self.counted_mib
        return self._measured_mib or self.vram_mib

    @property
    def measured_mib(self) -> int | None:
        return self._measured_mib

    def record_measured(self, mib: int) -> None:
        """What the GPU showed its last start used (admission measures it)."""
        self._measured_mib = mib

    @property
    def yield_method(self) -> str:
        """How a yield frees its memory: `auto`, `stop` or `sleep`."""
        return self._yield_method_override or self._backend.config.yield_.method

    @property
    def yield_how(self) -> ReleaseConfig:
        """`yield:` with a GPU profile's method, if any."""
        how = self._backend.config.yield_
        override = self._yield_method_override
        if override is None or override == how.method:
            return how
        return ReleaseConfig.model_validate({"method": override, "level": how.level})

    @property
    def sleep_supported(self) -> bool:
        """Whether its server offers sleep mode (a GPU profile's `sleep_mode` wins)."""
        if self._yield_method_override is not None:
            return self._yield_method_override == "sleep"
        return self._backend.config.sleep_supported

    def record_loaded_weights(self, weights_bytes: int) -> None:
        """What vLLM said its weights took when it loaded ("Model loading took X GiB",
        summed over its GPUs): the host RAM a level-1 sleep charges from now on."""
        self._loaded_weights_bytes = weights_bytes

    @property
    def ram_charge(self) -> tuple[int | None, str | None]:
        """(MiB of host RAM its weights hold asleep at level 1, where from), by
        `app.lifecycle.release.ram_charge`."""
        return ram_charge(self._loaded_weights_bytes, self._backend.config)

    @property
    def ram_charge_mib(self) -> int | None:
        return self.ram_charge[0]

    @property
    def releasing_level(self) -> int | None:
        """While stopping: the level it is going to sleep at (None: a stop)."""
        return self._releasing_level if self._backend.state is BackendState.STOPPING else None

    def set_yield_method(self, method: str | None) -> None:
        """A GPU profile's choice of yield method; None: the backend's own config."""
        self._yield_method_override = method

    def take_over(self, old: Memory) -> None:
        """The profile's yield method of the backend this one replaces (a reload)."""
        self._yield_method_override = old._yield_method_override

    @property
    def may_have_slept(self) -> bool:
        """Whether a server found running at gateway start may be asleep."""
        override = self._yield_method_override
        return self.sleep_supported or rules.may_have_slept(self._backend.config, override)
