"""Which calibration a split uses for each device kind (:mod:`onnxsplit.calibrate`): the
one kept with its profile entry, else measured now, in a fresh process as `run` measures,
and kept.  A provider beside the CPU EP that fails on the whole model is refused in one
note and planned without; where several providers share the cores, their best are
measured again side by side so that the choice rests on one stretch of the machine's time.

Write-up: docs/machine.md (Calibration).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from . import calibrate, machine, progress
from .build import pick_entries
from .errors import OnnxsplitError
from .profile import ProfileFile, available_providers
from .profile.devices import CPU_EP, describe, precision_note, whole_on_cores
from .profile.measure import input_feeds
from .solve import isolated


def calibrated(graph, known, cache, cluster, acc, workload, quiet: bool, again: bool = False):
    """The calibration of each device kind (``calibrate``), measured here where the profile
    entry has none (or ``again``: the machine moved since; or a stale one,
    :func:`calibrate.stale`) and the EP is present, and stored with the entry.  A provider
    beside the CPU EP on its cores that fails on the whole model (OpenVINO compiling a
    decoder's dynamic shapes) is refused as profiling refuses one: a note, its entry
    marked ``refused`` (returned by the id of the entry it replaces), the plan without it."""
    cpu_entry, acc_entry = pick_entries(known, cluster.cpu, acc)
    present = available_providers()
    out: dict[str, Any] = {}
    unopt: dict[str, float | None] = {}
    store = None
    feeds = None
    model_bytes = float(workload.size.sum())
    kinds = [("cpu", cpu_entry), ("acc", acc_entry)]
    kinds += [(ep, known.entry(ep, hardware=describe(ep))) for ep in cluster.cpu.shared_by]
    fresh = set()  # the kinds calibrated now
    refused: dict[int, Any] = {}
    for kind, entry in kinds:
        if entry is None or entry.settings.get("refused"):
            continue  # (a provider that refused the model: planned without)
        unopt[kind] = entry.whole_model_ms.get("median")
        record = dict(entry.as_run)
        if entry.execution_provider in present and (again or calibrate.stale(record)):
            record = {}
        if not record and entry.execution_provider in present:
            feeds = feeds if feeds is not None else input_feeds(graph)
            try:
                record = _calibrate_whole(graph, entry.execution_provider, feeds, quiet, model_bytes)
            except OnnxsplitError as e:
                if kind in ("cpu", "acc"):
                    raise
                why = _refusal(entry.execution_provider, e)
                refused[id(entry)] = replace(entry, settings={**entry.settings, "refused": why})
                store = store or ProfileFile.load(cache)
                store.put(refused[id(entry)])
                continue
            store = store or ProfileFile.load(cache)
            store.put(replace(entry, as_run=record))
            fresh.add(kind)
        elif kind == "cpu" and record and not machine.CallCosts.of(record).measured \
                and entry.execution_provider in present:
            # a calibration from before the runner's own costs were measured: add them
            with isolated.Child() as child:
                record["runner"] = child.call("onnxsplit.calibrate:runner_costs")
            store = store or ProfileFile.load(cache)
            store.put(replace(entry, as_run=record))
        if record:
            out[kind] = record
    whole_only, measured = _whole_only(graph, cpu_entry, out, present, cluster, quiet, model_bytes)
    if measured:  # (kept with the CPU's calibration)
        fresh |= set(measured)
        store = store or ProfileFile.load(cache)
        store.put(replace(cpu_entry, as_run=out["cpu"]))
    if whole_only:
        out["whole_only"] = whole_only
    on_cores = [ep for ep in cluster.cpu.shared_by if ep in out and ep in present] + list(whole_only)
    if out.get("cpu") and on_cores and fresh & {"cpu", *on_cores}:
        # each provider's best measured again beside the others': the choice between
        # them then rests on one stretch of the machine's time (calibrate.side_by_side)
        records = {CPU_EP: out["cpu"], **{ep: out.get(ep) or whole_only[ep] for ep in on_cores}}
        runs = calibrate.finalists(records)  # (none where one provider is far ahead)
        if runs:
            progress.say(quiet, f"measuring {', '.join(sorted({p for p, _ in runs.values()}))} side by side")
            feeds = feeds if feeds is not None else input_feeds(graph)
            with progress.ticking("measuring side by side", quiet):  # (each in a process of its own)
                got = calibrate.side_by_side(graph.path, feeds, runs, model_bytes=model_bytes)
            calibrate.take_side_by_side(records, got)
        store = store or ProfileFile.load(cache)
        for kind, entry in kinds:
            if entry is not None and kind in ("cpu", *on_cores):
                store.put(replace(entry, as_run=out[kind]))  # (the CPU's holds the whole-only ones)
    if store is not None:
        try:
            store.save()
        except OSError:
            pass  # a read-only cache: the calibration is used, just not kept
    return out, unopt, refused


def _whole_only(graph, cpu_entry, out, present, cluster, quiet: bool, model_bytes: float
                ) -> tuple[dict[str, Any], list[str]]:
    """The calibration of each provider weighed for the whole model only
    (``devices.whole_on_cores``), by provider: kept in the CPU entry's calibration under
    ``whole_only`` (by provider and the precision it computed in), measured here where that
    has none (returned second: those measured now, which ``out["cpu"]`` now holds).  One
    that fails on the model is a note and ``{"refused": why}``, kept, so that it is not
    tried again."""
    if cpu_entry is None or not out.get("cpu") or not cluster.cpu.count:
        return {}, []
    kept = dict(out["cpu"].get("whole_only") or {})
    got: dict[str, Any] = {}
    measured = []
    for ep in whole_on_cores():
        if ep in cluster.cpu.shared_by or ep not in present:
            continue
        key = ep + precision_note(ep)
        if not kept.get(key):
            try:
                kept[key] = _calibrate_whole(graph, ep, input_feeds(graph), quiet, model_bytes)
            except OnnxsplitError as e:
                kept[key] = {"refused": _refusal(ep, e)}
            measured.append(ep)
        if "refused" not in kept[key]:
            got[ep] = kept[key]
    if measured:
        out["cpu"]["whole_only"] = kept
    return got, measured


def _calibrate_whole(graph, ep: str, feeds, quiet: bool, model_bytes: float) -> dict[str, Any]:
    """The whole model calibrated on ``ep`` (``calibrate.calibrate``) in a fresh process, as
    `run` measures, apart from what profiling left in this one (sessions, arenas, threads)."""
    progress.say(quiet, f"calibrating the whole model on {ep} (as users run it)")
    with isolated.Child() as child, progress.ticking(
            f"calibrating on {ep.removesuffix('ExecutionProvider')}", quiet):
        record = child.call("onnxsplit.calibrate:calibrate", str(graph.path), feeds, ep,
                            model_bytes=model_bytes)
    noisy = record.get("noisy")
    if noisy and not quiet:  # (a note, not progress: it stays where a pipe or a log gets it)
        print(f"onnxsplit: note: the machine was busy while calibrating on {ep}: configuration "
              f"{noisy['config']}'s rounds still spread {100 * noisy['spread']:.0f}% after {noisy['tries']} "
              "tries; the predictions beside it may be far off (`onnxsplit run` measures again; "
              "--recalibrate when the machine is quiet)", file=sys.stderr, flush=True)
    return record


def _refusal(ep: str, error: Exception) -> str:
    """Why ``ep`` is planned without, said even where progress is not (the user should know
    what was left out)."""
    why = f"{ep} failed on the whole model: {' '.join(str(error).split())[:300]}"
    print(f"onnxsplit: note: {why}; planning without it", file=sys.stderr, flush=True)
    return why
