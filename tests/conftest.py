"""Shared fixtures: where the paper's workloads are (skipped when absent), and the test tiers.

Tiers (`make test` runs everything; `make test-quick` runs the quick tier, under a minute):

* ``paper``: the test needs the paper's workloads: it takes the ``expected`` fixture, carries
  the ``needs_paper`` mark, or its body reads ``PAPER``. Marked here, at collection.
* ``slow``: the test function is in ``SLOW`` below. Marked here, at collection.
* ``every_provider``: the test sees every execution provider installed (OpenVINO's
  runtime, plugin EPs).  Every other test runs with ONNXSPLIT_PROVIDERS set to the CPU EP
  alone: a main command calibrates each provider on the cores (about twice the time with
  OpenVINO beside the CPU EP), and what the tests outside tests/test_providers.py check
  does not turn on OpenVINO.

Profile caches: every test runs with ONNXSPLIT_CACHE_DIR set to one cache per run (per
worker under pytest-xdist), never the user's (``shared_cache``); a test that reads or
damages what the cache holds takes ``own_cache``.
* ``ONNXSPLIT_TEST_SEEDS=N``: of every test function parametrised over ``seed`` (alone or
  as in ``"make, seed"``), only the cases with its first N distinct seeds run; the rest are
  deselected. Unset: every seed runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def paper_data_dir() -> Path | None:
    env = os.environ.get("ONNXSPLIT_PAPER_DATA")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "paper-workloads"]:
        if (cand / "expected.json").is_file():
            return cand
    return None


PAPER = paper_data_dir()
PAPER_REASON = "paper workloads absent (../shared or ONNXSPLIT_PAPER_DATA)"
needs_paper = pytest.mark.skipif(PAPER is None, reason=PAPER_REASON)


@pytest.fixture(scope="session")
def expected() -> dict:
    if PAPER is None:
        pytest.skip("paper workloads absent")
    return json.loads((PAPER / "expected.json").read_text())


# The test functions marked `slow`, by name (every case of a function shares its mark).
# How the list was made: the whole suite run once with
#     .venv/bin/python -m pytest -q --durations=0 -p no:randomly > /tmp/durations.txt
# (setup + call + teardown summed per case), a function is listed where some case takes more
# than about 1 s (subprocesses, onnxruntime sessions, MIP / CP-SAT solves, waits for time
# limits), or where its cases together still take more than about 2.5 s once
# ONNXSPLIT_TEST_SEEDS=3 has cut its seeds. Not listed: a case slow only because it is the
# first to compile a numba kernel (seed 0 of test_exact_when_memory_is_ample, ...): the
# compile would only move to the next test, and numba caches it on disk for the next run.
# With the list below `make test-quick` took about 30 s, 55 s with numba's cache empty (2 cores).
# (The main command's tests became slow once its calibration warmed up and measured again
# where rounds spread wide, and measured OpenVINO beside onnxruntime: listed below.)
# To refresh it: rerun that command, sum the slowest lines per function, and keep
# `make test-quick` under a minute (it prints its own time and slowest tests). Names are bare
# function names: they are unique across tests/, and they survive a test file being renamed.
SLOW = frozenset({
    # test_ray.py / test_serve.py: a local Ray (or a cluster of two nodes) started per case (4 - 21 s)
    "test_run_on_a_local_ray_beside_the_threaded_runner",
    "test_stream_keeps_order_and_matches_the_original",
    "test_parts_pinned_to_machines_run_on_their_nodes",
    "test_interrupting_the_ray_engine_leaves_no_ray_behind",
    "test_a_part_on_openvino_runs_on_a_ray_actor",
    # test_served.py: one server under every load (45 s alone)
    "test_one_server_takes_every_load_and_stops_cleanly",
    # test_stress.py: a Ray test cluster losing a node (12 - 45 s)
    "test_a_node_lost_mid_run_ends_in_one_line_naming_the_part",
    # test_deadlines.py: waits for time limits, Ctrl-C in subprocesses (1 - 9 s a case)
    "test_a_solve_returns_by_its_time_limit_with_a_valid_plan",
    "test_an_interrupted_main_command_leaves_the_previous_output",
    "test_ctrl_c_ends_a_long_solve_within_two_seconds",
    "test_ctrl_c_ends_a_measuring_run_within_two_seconds",
    "test_an_interrupted_write_leaves_no_plan_file",
    "test_a_method_that_overruns_before_any_plan_falls_back_to_the_model_whole",
    "test_a_method_that_overruns_returns_the_best_plan_it_offered",
    "test_a_long_solve_shows_its_progress_and_the_json_carries_the_trace",
    # test_series.py / test_bound_series.py: latency MIPs on chains of modules (0.5 - 14 s a case)
    "test_series_beats_the_sequence_split_on_inception",
    "test_some_calls_reach_into_a_block",
    "test_series_plan_is_valid_and_its_composed_latency_is_exact",
    "test_bound_is_the_optimum_on_chains_of_modules",
    # test_baselines.py
    "test_local_search_respects_memory",
    "test_pipedream_collapses_branches",
    # test_properties.py: many random graphs cut and run in onnxruntime
    "test_any_dag_cut_by_any_plan_reproduces_the_original",
    "test_any_damaged_manifest_is_one_line_or_runs",
    # test_graph.py / test_split.py / test_cli.py: whole models through onnxruntime
    "test_light_zoo_models",
    "test_split_tiny_bert_reproduces_the_model",
    "test_the_main_command_splits_the_genai_decoder",  # test_contrib_ops.py: export --plan, 9 s
    "test_latency_split_with_cpu_calls_around_accelerator_calls",
    "test_pins_keep_matching_operators_on_the_cpu",
    "test_python_api_split_then_run",
    "test_compare_lists_every_method_against_one_bound",
    # test_call_times.py: waits past a deadline
    "test_past_its_deadline_it_claims_nothing",
    # test_cpsat.py: CP-SAT workers and HiGHS side by side
    "test_threads_share_the_workers_beside_highs",
    # test_reliability.py / test_export.py: 9 cases of 0.35 - 0.7 s (CLI subprocesses, exports)
    "test_a_damaged_plan_file_is_one_line",
    "test_random_contiguous_plans",
    "test_random_scattered_plans",
    # a main command (or `run`) that calibrates a model in a cache of its own, or several
    # providers on the cores (10 - 50 s a case)
    "test_a_calibration_whose_copies_no_longer_run_as_chosen_is_measured_again",
    "test_a_calibration_whose_rounds_spread_wide_is_measured_again",
    "test_a_damaged_profile_cache_is_set_aside_and_measured_again",
    "test_a_profile_cache_that_cannot_be_written_is_a_note",
    "test_a_profile_that_is_no_file_is_set_aside_or_one_line",
    "test_a_manifest_that_is_no_file_is_one_line_not_a_hang",
    "test_a_full_disk_names_the_output",
    "test_a_model_openvino_refuses_is_planned_without_it",
    # (these three run whole only where OpenVINO's EP offers a device and the CPU has bf16
    # units, as on an Intel Xeon with AMX: 27 - 50 s there beside a CPU-bound process)
    "test_openvinos_ep_is_weighed_for_the_whole_model_in_each_precision",
    "test_parts_on_openvino_compute_in_bf16_where_the_user_allows_it",
    "test_a_provider_failing_on_the_whole_model_is_planned_without",
    "test_a_plan_run_by_openvino_is_written_and_verifies",
    "test_a_split_across_onnxruntime_and_openvino_runs_and_verifies",
    "test_compare_lists_the_model_kept_whole_as_onnxruntime_runs_it",
    "test_compare_on_a_model",
    "test_control_flow_model_splits_and_verifies",
    "test_each_providers_best_is_measured_side_by_side",
    "test_existing_output_needs_force",
    "test_input_value_steers_the_check_run",
    "test_main_command_is_never_the_slower_of_its_own_candidates",
    "test_main_command_plans_for_every_class_at_once",
    "test_plan_json_is_editable_and_reapplied",
    "test_recalibrate_measures_the_machine_again",
    "test_run_parts_measures_and_checks",
    "test_run_weighs_the_default_session_against_its_calibrated_figures",
    # test_parts_report.py: a model profiled and calibrated, its report opened in headless
    # Chromium (10 - 45 s a case)
    "test_small_bert_report_from_the_main_command_and_run_report",
    "test_a_decoder_split_by_its_layers_reads_one_row_a_layer",
    "test_a_10000_operator_workload_fits_two_screens",
    # test_generate.py: a decoder split (export, or the main command at two contexts: 35 s), then
    # generating beside the original
    "test_context_plans_a_decoding_step_with_its_kv_cache_against_memory",
    "test_the_parts_generate_what_the_model_does",
    "test_an_onnxruntime_genai_model_split_in_two_generates_beside_onnxruntime_genai",
    # test_progress.py: a model split three times (on a pseudo-terminal, with --json, in a pipe)
    "test_the_main_command_shows_its_progress_on_a_terminal_only",
})

# Of the slow, the longest beside a CPU-bound process (make test's --durations, 2 cores),
# longest first: they start first, so the run does not end on one of them that a worker's
# queue reached last (test_served's Ray server: 57 s beside one, 101 - 328 s while Ray ran
# its workers at nice 15; the next: 30 - 60 s).
LONGEST = (
    "test_one_server_takes_every_load_and_stops_cleanly",
    "test_openvinos_ep_is_weighed_for_the_whole_model_in_each_precision",
    "test_parts_on_openvino_compute_in_bf16_where_the_user_allows_it",
    "test_run_on_a_local_ray_beside_the_threaded_runner",
    "test_parts_pinned_to_machines_run_on_their_nodes",
    "test_the_main_command_shows_its_progress_on_a_terminal_only",
    "test_a_node_lost_mid_run_ends_in_one_line_naming_the_part",
    "test_context_plans_a_decoding_step_with_its_kv_cache_against_memory",
    "test_a_part_on_openvino_runs_on_a_ray_actor",
    "test_stream_keeps_order_and_matches_the_original",
)

MARKERS = {
    "slow": "slow: takes long (listed in tests/conftest.py SLOW); deselect with -m 'not slow'",
    "paper": "paper: needs the paper workloads (../shared or ONNXSPLIT_PAPER_DATA); deselect with -m 'not paper'",
    "every_provider": "every_provider: sees every execution provider installed (others: the CPU EP alone, tests/conftest.py)",
    "full_timing": "full_timing: measures for as long as a user's command does (others: ONNXSPLIT_TIMING_SCALE, tests/conftest.py)",
    "least_timing": "least_timing: measures at a twentieth of a user's timing: checks what is drawn and runs where, not figures (tests/conftest.py)",
}
SEEDS_ENV = "ONNXSPLIT_TEST_SEEDS"


def pytest_configure(config: pytest.Config) -> None:
    # pyproject.toml registers these too; registering here keeps --strict-markers happy
    # when pytest runs with another ini file (-c) or none
    known = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    for name, line in MARKERS.items():
        if name not in known:
            config.addinivalue_line("markers", line)


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("onnxsplit-cache")


@pytest.fixture(autouse=True)
def shared_cache(_session_cache, monkeypatch) -> Path:
    """ONNXSPLIT_CACHE_DIR: one profile cache for the whole run, never the user's own: a
    model's profile and calibration are measured once, as a user's cache keeps them.  A
    test that reads or damages what it holds takes :func:`own_cache`."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(_session_cache))
    return _session_cache


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """A profile cache of the test's own, empty at its start (tmp_path / "cache")."""
    monkeypatch.setenv("ONNXSPLIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ONNXSPLIT_TIMING_SCALE (onnxsplit/running/timing.py) for every test but one marked
# ``full_timing``: a fifth of every measurement's seconds (a tiny model's main command
# calibrated for 36 s, 9.5 s so; `run`'s rounds last at least 1 s each, 0.2 s so).  What the
# tests check of a measurement is what it records and how it is used, not its figures to the
# percent; a test that weighs a prediction against a measurement takes the mark
TIMING_SCALE = "0.2"
# for a test marked ``least_timing``: a twentieth, where a test checks only what is drawn and
# what runs where (the progress test had taken 45 s of a worker's time at a fifth, the
# local-Ray run test a minute)
LEAST_TIMING_SCALE = "0.05"


@pytest.fixture(autouse=True)
def short_timing(request, monkeypatch):
    from onnxsplit.running.timing import SCALE_ENV

    if request.node.get_closest_marker("full_timing") is not None:
        monkeypatch.delenv(SCALE_ENV, raising=False)
    elif request.node.get_closest_marker("least_timing") is not None:
        monkeypatch.setenv(SCALE_ENV, LEAST_TIMING_SCALE)
    else:
        monkeypatch.setenv(SCALE_ENV, TIMING_SCALE)


@pytest.fixture(autouse=True)
def cpu_ep_alone(request, monkeypatch):
    """ONNXSPLIT_PROVIDERS: the CPU EP alone, but for a test marked ``every_provider``
    (subprocesses inherit it)."""
    if request.node.get_closest_marker("every_provider") is None:
        from onnxsplit.profile.devices import CPU_EP, PROVIDERS_ENV

        monkeypatch.setenv(PROVIDERS_ENV, CPU_EP)


def _seed_budget(config: pytest.Config) -> int | None:
    raw = os.environ.get(SEEDS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        raise pytest.UsageError(f"{SEEDS_ENV} must be a whole number, not {raw!r}") from None
    if n < 0:
        raise pytest.UsageError(f"{SEEDS_ENV} must be 0 or more, not {n}")
    return n


def _reads_paper(code) -> bool:
    """Whether a function's code (or a function, lambda or comprehension inside it) names PAPER."""
    if "PAPER" in code.co_names:
        return True
    return any(_reads_paper(c) for c in code.co_consts if hasattr(c, "co_names"))


def _needs_paper(item: pytest.Item) -> bool:
    if "expected" in getattr(item, "fixturenames", ()):
        return True
    if any(m.kwargs.get("reason") == PAPER_REASON for m in item.iter_markers("skipif")):
        return True
    fn = getattr(item, "function", None)
    code = getattr(fn, "__code__", None)
    return code is not None and _reads_paper(code)


def _bare_name(item: pytest.Item) -> str:
    """The test function's own name, without its file or parameter ids (as SLOW lists it)."""
    return getattr(item, "originalname", None) or item.name.split("[", 1)[0]


def _function_key(item: pytest.Item) -> str:
    """The test function a case belongs to: its node id without the parameter ids."""
    return item.nodeid.split("[", 1)[0]


def _seed_of(item: pytest.Item):
    callspec = getattr(item, "callspec", None)
    if callspec is None or "seed" not in callspec.params:
        return None, None
    seed = callspec.params["seed"]
    try:
        hash(seed)
    except TypeError:
        seed = repr(seed)
    return seed, callspec.indices.get("seed", 0)


@pytest.hookimpl(tryfirst=True)  # before -m and -k choose, so they see the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _bare_name(item) in SLOW:
            item.add_marker(pytest.mark.slow)
        if _needs_paper(item):
            item.add_marker(pytest.mark.paper)
    # the slow tests first, the LONGEST first of all (a stable sort: files and cases keep
    # their order): under pytest-xdist's worksteal the workers then end on quick tests, not
    # on one of minutes that a worker's queue reached last
    rank = {name: k for k, name in enumerate(LONGEST)}
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, rank.get(_bare_name(item), len(rank))))

    budget = _seed_budget(config)
    if budget is None:
        return
    # the first N distinct seeds of each function, in parametrisation order (the index of
    # the case in its parametrize list, so the order items were collected or shuffled in
    # does not matter; for "make, seed" pairs a seed counts from its first pair)
    seen: dict[str, dict] = {}
    for item in items:
        seed, index = _seed_of(item)
        if index is not None:
            first = seen.setdefault(_function_key(item), {})
            first[seed] = min(index, first.get(seed, index))
    keep_seeds = {key: set(sorted(first, key=first.__getitem__)[:budget]) for key, first in seen.items()}
    kept, dropped = [], []
    for item in items:
        seed, index = _seed_of(item)
        if index is None or seed in keep_seeds[_function_key(item)]:
            kept.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    config.stash[_SEED_CUT] = (budget, len(seen), len(dropped))


_SEED_CUT = pytest.StashKey[tuple]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    # one line, even under -qq (where pytest itself does not count the deselected)
    if _SEED_CUT in config.stash:
        budget, functions, dropped = config.stash[_SEED_CUT]
        terminalreporter.write_line(f"{SEEDS_ENV}={budget}: the first {budget} seeds of each of "
                                    f"{functions} seeded test functions kept, {dropped} cases deselected")
