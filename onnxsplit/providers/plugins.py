"""Plugin execution providers: onnxruntime's EPs shipped as libraries of their own.

Since 1.23 onnxruntime loads execution providers from separate libraries
(``register_execution_provider_library``); each then offers EP devices
(``get_ep_devices``), and a session takes one with ``SessionOptions.add_provider_for_devices``
rather than by name -- such an EP is not in ``get_available_providers()``.  This module
finds the libraries (the pip packages in KNOWN, and ``--ep-library NAME=PATH``, which the
CLI passes on through ENV so that child processes and Ray actors load the same ones),
registers each once per process, and says what each offers here: its devices, or in one
line why none (the OpenVINO plugin takes Intel hardware only; on another vendor's CPU it
offers nothing, while OpenVINO's own runtime still runs there: ``onnxsplit.providers.openvino``).
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import OnnxsplitError

# EP name -> the pip package whose get_library_path() names its library
KNOWN = {"OpenVINOExecutionProvider": "onnxruntime_ep_openvino"}
# why a known plugin may offer no device, where its vendor says
NO_DEVICE_WHY = {"OpenVINOExecutionProvider": "it offers Intel CPUs, GPUs and NPUs only"}
ENV = "ONNXSPLIT_EP_LIBRARIES"  # NAME=PATH[;NAME=PATH...]: libraries to load beside KNOWN

_lock = threading.Lock()
_registered: dict[str, str] = {}  # EP name -> library path registered in this process
_failed: dict[str, str] = {}  # EP name -> why its library did not load


@dataclass(frozen=True)
class Plugin:
    """A plugin EP library and what it offers on this machine."""

    name: str  # the EP name its devices carry
    library: str  # the shared library's path
    source: str  # the package it came from, or 'ONNXSPLIT_EP_LIBRARIES'
    devices: tuple[dict[str, Any], ...]  # what get_ep_devices() lists for it, described
    error: str | None = None  # why it did not load

    @property
    def why_none(self) -> str:
        """One line: why this plugin offers no device here."""
        if self.error:
            return f"its library did not load: {self.error}"
        vendor = NO_DEVICE_WHY.get(self.name)
        return "installed, but it offers no device on this machine" + (f" ({vendor})" if vendor else "")


def parse_spec(text: str) -> dict[str, str]:
    """``NAME=PATH[;NAME=PATH...]`` (also comma-separated) -> {NAME: PATH}; OnnxsplitError
    naming the part that is not NAME=PATH."""
    out: dict[str, str] = {}
    for item in (s.strip() for s in text.replace(",", ";").split(";")):
        if not item:
            continue
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise OnnxsplitError(f"--ep-library '{item}': expected NAME=PATH, e.g. "
                                 "OpenVINOExecutionProvider=/path/libonnxruntime_providers_openvino_plugin.so")
        out[name.strip()] = path.strip()
    return out


def add_libraries(spec: str) -> None:
    """Add ``--ep-library`` specs for this process and every process it starts (ENV);
    OnnxsplitError for a malformed spec or a library file that is not there."""
    given = parse_spec(spec)
    for name, path in given.items():
        if not Path(path).is_file():
            raise OnnxsplitError(f"--ep-library {name}={path}: no such file")
    merged = {**parse_spec(os.environ.get(ENV, "")), **given}
    os.environ[ENV] = ";".join(f"{k}={v}" for k, v in merged.items())
    libraries.cache_clear()


@functools.lru_cache(maxsize=None)
def libraries() -> dict[str, tuple[str, str]]:
    """EP name -> (library path, where it came from): the known packages installed here,
    then ENV's (which win for the same name)."""
    out: dict[str, tuple[str, str]] = {}
    for ep, package in KNOWN.items():
        try:
            module = importlib.import_module(package)
            out[ep] = (str(module.get_library_path()), package)
        except Exception:  # not installed, or its library is missing
            continue
    try:
        given = parse_spec(os.environ.get(ENV, ""))
    except OnnxsplitError:
        given = {}
    for ep, path in given.items():
        out[ep] = (path, ENV)
    return out


def register() -> dict[str, str]:
    """Register every plugin library found (once per process); EP name -> library of those
    that loaded.  One that fails is remembered with its error, not raised: the rest of
    onnxsplit works as without it."""
    found = libraries()
    with _lock:
        todo = {ep: lib for ep, lib in found.items() if ep not in _registered and ep not in _failed}
        if todo:
            import onnxruntime as ort

            register_library = getattr(ort, "register_execution_provider_library", None)
            for ep, (path, _) in todo.items():
                if register_library is None:
                    _failed[ep] = f"onnxruntime {ort.__version__} cannot load plugin EPs (1.23 or later can)"
                    continue
                try:
                    register_library(ep, path)
                    _registered[ep] = path
                except Exception as e:
                    text = " ".join(str(e).split())
                    if "already registered" in text.lower():
                        _registered[ep] = path
                    else:
                        _failed[ep] = text[:200]
        return dict(_registered)


def ep_devices(ep: str) -> list:
    """onnxruntime's EP devices of the plugin ``ep`` (registered first); [] where none."""
    if ep not in register():
        return []
    import onnxruntime as ort

    return [d for d in ort.get_ep_devices() if d.ep_name == ep]


def hardware_type(device) -> str:
    """``cpu``, ``gpu`` or ``npu``: the kind of hardware an EP device drives."""
    return str(device.device.type).rsplit(".", 1)[-1].lower()


def _describe(device) -> dict[str, Any]:
    meta = dict(device.ep_metadata)
    return {"type": hardware_type(device), "vendor": device.device.vendor,
            "device_id": int(device.device.device_id),
            **({"ov_device": meta["ov_device"]} if "ov_device" in meta else {})}


def plugins() -> list[Plugin]:
    """Every plugin library found, with the devices it offers here (``onnxsplit devices``)."""
    loaded = register()
    out = []
    for ep, (path, source) in libraries().items():
        devices = tuple(_describe(d) for d in ep_devices(ep)) if ep in loaded else ()
        out.append(Plugin(ep, path, source, devices, _failed.get(ep)))
    return out


def providers() -> list[str]:
    """The plugin EPs that offer at least one device here."""
    return [ep for ep in register() if ep_devices(ep)]


def cpu_providers() -> list[str]:
    """The plugin EPs that offer a CPU device: they run on the host's cores, which the
    CPU EP uses too (a plan counts those cores once)."""
    return [ep for ep in register() if any(hardware_type(d) == "cpu" for d in ep_devices(ep))]


def pick_device(ep: str, kind: str = "cpu", index: int = 0):
    """The ``index``-th device of hardware ``kind`` that plugin ``ep`` offers; OnnxsplitError
    where it has none."""
    found = [d for d in ep_devices(ep) if hardware_type(d) == kind]
    if len(found) <= index:
        raise OnnxsplitError(f"{ep} offers {len(found)} {kind} device(s) here, "
                             f"not device {index}")
    return found[index]


def add_to_session(so, ep: str, options: Mapping[str, str] | None = None, kind: str = "cpu",
                   index: int = 0) -> None:
    """Put plugin ``ep``'s device on session options ``so`` (onnxruntime puts what it does
    not take on the CPU EP).  OpenVINO's EP computes as onnxsplit's OpenVINO parts do
    (:func:`precision_config`)."""
    options = {**precision_config(ep, kind, (options or {}).get("load_config")),
               **{k: v for k, v in (options or {}).items() if k != "load_config"}}
    so.add_provider_for_devices([pick_device(ep, kind, index)], {k: str(v) for k, v in options.items()})


def as_config(ep: str, options: Mapping[str, str]) -> dict[str, str]:
    """Provider options of plugin ``ep`` as session config entries (``ep.<name>.<option>``,
    onnxruntime's own form): how a manifest part's ``config`` carries them."""
    return {f"ep.{ep.lower()}.{k}": str(v) for k, v in options.items()}


def options_of(ep: str, config: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(plugin ``ep``'s provider options, the other session config entries) of a part's
    ``config`` (:func:`as_config`)."""
    prefix = f"ep.{ep.lower()}."
    options = {k[len(prefix):]: str(v) for k, v in config.items() if k.startswith(prefix)}
    return options, {k: str(v) for k, v in config.items() if not k.startswith(prefix)}


def precision_config(ep: str, kind: str = "cpu", load_config: str | None = None) -> dict[str, str]:
    """OpenVINO's EP computes in bf16 by default on a CPU with bf16 units (its ``precision``
    option is ignored there): the ``load_config`` that holds it to what onnxsplit's OpenVINO
    parts compute in (``--precision``: OpenVINO's own default unless told), merged into ``load_config``
    where one is given.  Nothing for other EPs."""
    from . import openvino

    if ep != openvino.PLUGIN_EP or kind not in ("cpu", "gpu"):
        return {"load_config": load_config} if load_config else {}
    import json

    config = json.loads(load_config) if load_config else {}
    config.setdefault(kind.upper(), {}).setdefault("INFERENCE_PRECISION_HINT", openvino.precision())
    return {"load_config": json.dumps(config)}


def part_config(ep: str) -> dict[str, str]:
    """The config entries that hold a part on ``ep`` to what onnxsplit's OpenVINO parts
    compute in under `run` (nothing in float32, or for a provider other than OpenVINO's):
    OpenVINO's own property for its runtime, the plugin EP's ``load_config`` for the EP."""
    from . import openvino

    p = openvino.precision()
    if p == "f32":
        return {}
    if ep == openvino.RUNTIME:
        return {"INFERENCE_PRECISION_HINT": p}
    if ep == openvino.PLUGIN_EP:
        return as_config(ep, precision_config(ep))
    return {}
