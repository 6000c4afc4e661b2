"""NVML as on a machine without an NVIDIA library (this one, CI): every in-process test's
default `Seams.nvml`, so `gpu.probe: auto` never asks the real driver of the machine
running the tests, and `auto` resolves the same everywhere (no probe)."""

from __future__ import annotations

from typing import Any, NoReturn

LIBRARY_NOT_FOUND = 12  # NVML_ERROR_LIBRARY_NOT_FOUND (nvml.h)


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NoNvml:
    """The `pynvml` module where libnvidia-ml.so.1 is missing: `nvmlInit` fails."""

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0

    def __init__(self) -> None:
        self.inits = 0

    def nvmlInit(self) -> NoReturn:
        self.inits += 1
        raise NVMLError(LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> NoReturn:
        raise NVMLError(LIBRARY_NOT_FOUND)

    def __getattr__(self, name: str) -> Any:  # any other call: NVML is not there
        if name.startswith("nvml"):

            def missing(*_args: Any, **_kwargs: Any) -> NoReturn:
                raise NVMLError(LIBRARY_NOT_FOUND)

            return missing
        raise AttributeError(name)
