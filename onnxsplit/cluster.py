"""Devices and the links between them, read from a small JSON (or YAML) spec.

A :class:`Cluster` holds device specs (class ``cpu`` is the host's cores; the others are
accelerators, each driven by an onnxruntime execution provider: measured where present,
else estimated from its peaks) with count and memory, and links between device classes
with bandwidth and latency.  Quantities take units (``"16GiB"``, ``"900GB/s"``,
``"10us"``); unknown fields are errors; a spec without a ``cpu`` device gets this
machine's.

Write-up, with an example and every field: docs/machine.md (Cluster specs).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import ClusterError
from .files import loads

CPU_CLASS = "cpu"


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    cls: str
    count: int
    execution_provider: str | None  # None: never measured, always estimated
    memory: float
    peak_flops: float | None = None
    memory_bandwidth: float | None = None
    call_overhead: float | None = None
    efficiency: Mapping[str, float] | None = None
    unsupported_ops: tuple[str, ...] = ()
    machine: str | None = None  # the machine it is on (a Ray node's custom resource); None: any
    # the cpu class only: other providers that run on the same cores (OpenVINO's runtime,
    # a plugin EP's CPU device), each a way to run a part there, the cores counted once
    shared_by: tuple[str, ...] = ()

    @property
    def is_cpu(self) -> bool:
        return self.cls == CPU_CLASS

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "class": self.cls, "count": self.count}
        if self.execution_provider is not None:
            d["execution_provider"] = self.execution_provider
        d["memory"] = self.memory
        for k in ("peak_flops", "memory_bandwidth", "call_overhead"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.efficiency:
            d["efficiency"] = dict(self.efficiency)
        if self.unsupported_ops:
            d["unsupported_ops"] = list(self.unsupported_ops)
        if self.machine:
            d["machine"] = self.machine
        if self.shared_by:
            d["shared_by"] = list(self.shared_by)
        return d


@dataclass(frozen=True)
class LinkSpec:
    a: str
    b: str
    bandwidth: float  # bytes/s
    latency: float  # s

    def seconds(self, nbytes: float) -> float:
        """Time to move one tensor of ``nbytes`` over this link."""
        return self.latency + nbytes / self.bandwidth

    def to_json(self) -> dict:
        return {"between": [self.a, self.b], "bandwidth": self.bandwidth, "latency": self.latency}


@dataclass(frozen=True)
class Cluster:
    devices: tuple[DeviceSpec, ...]
    links: tuple[LinkSpec, ...] = ()
    source: str = "detected"  # the file it came from, or "detected"
    notes: tuple[str, ...] = field(default=(), compare=False)

    # ---- queries ------------------------------------------------------------------------
    @property
    def cpu(self) -> DeviceSpec:
        return next(d for d in self.devices if d.is_cpu)

    @property
    def accelerators(self) -> tuple[DeviceSpec, ...]:
        return tuple(d for d in self.devices if not d.is_cpu)

    def device(self, name: str) -> DeviceSpec:
        for d in self.devices:
            if d.name == name:
                return d
        for d in self.devices:
            if d.cls == name:
                return d
        raise ClusterError(f"{self.source}: no device named '{name}' "
                           f"(devices: {', '.join(d.name for d in self.devices)})")

    def link(self, a: str, b: str) -> LinkSpec | None:
        for lk in self.links:
            if {lk.a, lk.b} == {a, b}:
                return lk
        return None

    def to_json(self) -> dict:
        return {"devices": [d.to_json() for d in self.devices],
                "links": [lk.to_json() for lk in self.links]}

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def detect(cls) -> "Cluster":
        """This machine: its CPU cores and memory, plus a device per accelerator EP present."""
        from .profile import devices as dv

        cpu = DeviceSpec(name="cpu", cls=CPU_CLASS, count=os.cpu_count() or 1,
                         execution_provider=dv.CPU_EP, memory=float(dv.host_memory_bytes()),
                         shared_by=tuple(dv.planned_on_cores()))
        found = [cpu]
        links = []
        notes = []
        present = dv.available_providers()
        seen_classes = set()
        for ep in sorted(present, key=lambda e: (dv.EP_PREFERENCE.index(e)
                                                 if e in dv.EP_PREFERENCE else len(dv.EP_PREFERENCE))):
            klass = dv.EP_CLASS.get(ep)
            if ep == dv.CPU_EP or dv.shares_cpu(ep) or klass is None or klass in seen_classes:
                continue
            seen_classes.add(klass)
            count, memory = 1, 0.0
            if dv.ORTVALUE_DEVICE.get(ep) == "cuda" and dv.gpu_names():
                count = len(dv.gpu_names())
                mem = dv.gpu_memory_bytes()
                memory = float(min(mem)) if mem else 0.0
            if not memory:
                notes.append(f"memory of '{klass}' ({ep}) unknown: set it in a cluster file")
            found.append(DeviceSpec(name=klass, cls=klass, count=count, execution_provider=ep,
                                    memory=memory))
            links += _measured_links(ep, klass, count, notes)
        return cls(tuple(found), tuple(links), "detected", tuple(notes))

    @classmethod
    def from_file(cls, path: str | Path) -> "Cluster":
        path = Path(path)
        where = str(path)
        if not path.exists():
            raise ClusterError(f"cluster file '{path}' does not exist")
        try:
            text = path.read_text()
        except OSError as e:
            raise ClusterError(f"cannot read cluster file '{path}': {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ClusterError(f"'{path}' is not a text file") from None
        if path.suffix.lower() in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ClusterError(f"{where}: reading YAML needs pyyaml (pip install pyyaml); "
                                   "or write the cluster as JSON") from None
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as e:
                line = getattr(getattr(e, "problem_mark", None), "line", None)
                at = f" at line {line + 1}" if line is not None else ""
                raise ClusterError(f"{where}: not valid YAML{at}") from None
            except RecursionError:
                raise ClusterError(f"{where}: not valid YAML (nested too deeply)") from None
        else:
            try:
                data = loads(text)
            except json.JSONDecodeError as e:
                raise ClusterError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_dict(cls, data: Any, where: str = "cluster") -> "Cluster":
        if not isinstance(data, dict):
            raise ClusterError(f"{where}: the top level must be an object with 'devices' and 'links'")
        _no_unknown(data, ("devices", "links"), where)
        raw_devices = data.get("devices")
        if not isinstance(raw_devices, list) or not raw_devices:
            raise ClusterError(f"{where}: 'devices' must be a non-empty list")
        devs = [_device(d, f"{where}: devices[{i}]") for i, d in enumerate(raw_devices)]
        names = [d.name for d in devs]
        for n in names:
            if names.count(n) > 1:
                raise ClusterError(f"{where}: device name '{n}' is used twice")
        cpus = [d for d in devs if d.is_cpu]
        if len(cpus) > 1:
            raise ClusterError(f"{where}: {len(cpus)} devices of class 'cpu' "
                               f"({', '.join(d.name for d in cpus)}); give the host's cores as one")
        notes = []
        if not cpus:
            host = cls.detect().cpu
            devs.insert(0, host)
            notes.append(f"no 'cpu' device in {where}: using this machine's ({host.count} cores)")
        classes = {d.cls for d in devs}
        raw_links = data.get("links", [])
        if not isinstance(raw_links, list):
            raise ClusterError(f"{where}: 'links' must be a list")
        links = [_link(lk, f"{where}: links[{i}]", classes) for i, lk in enumerate(raw_links)]
        seen = set()
        for i, lk in enumerate(links):
            key = frozenset((lk.a, lk.b))
            if key in seen:
                raise ClusterError(f"{where}: links[{i}]: a second link between '{lk.a}' and '{lk.b}'")
            seen.add(key)
        return cls(tuple(devs), tuple(links), where, tuple(notes))


def _measured_links(ep: str, klass: str, count: int, notes: list[str]) -> list[LinkSpec]:
    """The host link of a detected accelerator class, and (two devices or more) the link
    between two of its devices: measured with onnxruntime's copies where it addresses the
    devices, else the host link assumed, and a note saying which."""
    from .profile import devices as dv
    from .profile import links as measure

    device = dv.ORTVALUE_DEVICE.get(ep)
    host = measure.host_link(device) if device else None
    if host is None:
        # PCIe 3.0 x16 as seen by an application, and a typical copy-call latency (an
        # H100 machine, through onnxruntime's CUDA EP: an Identity call 37 us with no
        # data, 13.97 ms for 64 MB in and out, so about 9.2 GB/s each way)
        notes.append(f"link cpu-{klass} assumed 12 GB/s, 10 us: measure and set it in a cluster file")
        return [LinkSpec(CPU_CLASS, klass, 12e9, 10e-6)]
    out = [LinkSpec(CPU_CLASS, klass, *host)]
    notes.append(f"link cpu-{klass} measured: {host[0] / 1e9:.3g} GB/s, {host[1] * 1e6:.3g} us")
    if count > 1:
        peer = measure.peer_link(ep, device, 0, 1)
        if peer is not None:
            out.append(LinkSpec(klass, klass, *peer))
            notes.append(f"link {klass}-{klass} (device 0 to 1) measured: {peer[0] / 1e9:.3g} GB/s, "
                         f"{peer[1] * 1e6:.3g} us")
        else:
            notes.append(f"link {klass}-{klass} not measured: transfers between its devices priced "
                         "through host memory")
    return out


# ------------------------------------------------------------------------ field parsing

_DEVICE_FIELDS = ("name", "class", "count", "execution_provider", "memory", "peak_flops",
                  "memory_bandwidth", "call_overhead", "efficiency", "unsupported_ops", "machine", "shared_by")
_LINK_FIELDS = ("between", "bandwidth", "latency")
# beyond these no link is (1 kB/s moves a GB in 12 days): a workload's transfer times made
# from them stay within what its solvers' float sums hold (workload.MOST_TIME)
LINK_BANDWIDTH = (1e3, 1e15)  # bytes/s
LINK_LATENCY = (1e-12, 1e6)  # s, where not 0

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50}
_TIME = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}  # divisors: "5us" is exactly 5e-06
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")
_UNITS = {  # kind -> accepted unit spellings after the prefix
    "bytes": ("B", ""),
    "bytes/s": ("B/s", "Bps"),
    "flops": ("FLOP/s", "FLOPS", "flop/s", "flops", ""),
}


def _no_unknown(d: dict, allowed, where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ClusterError(f"{where}: unknown field '{k}' (fields: {', '.join(allowed)})")


def quantity(value: Any, kind: str, where: str) -> float:
    """A number in base units from a number or a string such as "16GiB", "10us"."""
    if isinstance(value, bool):
        raise ClusterError(f"{where} must be a number, got {value!r}")
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str):
        m = _QUANTITY.match(value)
        x = None
        if m:
            num, unit = float(m.group(1)), m.group(2)
            if kind == "seconds":
                if unit in _TIME:
                    x = num / _TIME[unit]
                elif unit == "":
                    x = num
            else:
                for pre, mult in sorted(_PREFIX.items(), key=lambda kv: -len(kv[0])):
                    if unit.startswith(pre) and unit[len(pre):] in _UNITS[kind]:
                        x = num * mult
                        break
        if x is None:
            example = {"bytes": "'16GiB'", "bytes/s": "'900GB/s'", "flops": "'19.5TFLOP/s'",
                       "seconds": "'10us'"}[kind]
            raise ClusterError(f"{where} must be a number or a quantity like {example}, got {value!r}")
    else:
        raise ClusterError(f"{where} must be a number, got {value!r}")
    if not (x >= 0 and x != float("inf")):
        raise ClusterError(f"{where} must be a finite number >= 0, got {value!r}")
    return x


def _str(d: dict, key: str, where: str, default=None) -> str:
    if key not in d:
        if default is not None:
            return default
        raise ClusterError(f"{where}: missing field '{key}'")
    v = d[key]
    if not isinstance(v, str) or not v.strip():
        raise ClusterError(f"{where}.{key} must be a non-empty string, got {v!r}")
    return v


def _device(d: Any, where: str) -> DeviceSpec:
    from .profile import devices as dv

    if not isinstance(d, dict):
        raise ClusterError(f"{where} must be an object")
    if isinstance(d.get("name"), str) and d["name"].strip():
        where = f"{where} ('{d['name']}')"
    _no_unknown(d, _DEVICE_FIELDS, where)
    name = _str(d, "name", where)
    klass = _str(d, "class", where, default=name)
    count = d.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ClusterError(f"{where}.count must be an integer >= 0, got {count!r}")
    ep = dv.CPU_EP if klass == CPU_CLASS else None
    if d.get("execution_provider") is not None:
        ep = _str(d, "execution_provider", where)
    if "memory" not in d:
        if klass != CPU_CLASS:
            raise ClusterError(f"{where}: missing field 'memory' (bytes per device)")
        memory = float(dv.host_memory_bytes())
    else:
        memory = quantity(d["memory"], "bytes", f"{where}.memory")
    opt = {}
    for key, kind in (("peak_flops", "flops"), ("memory_bandwidth", "bytes/s"),
                      ("call_overhead", "seconds")):
        if d.get(key) is not None:
            opt[key] = quantity(d[key], kind, f"{where}.{key}")
            if key != "call_overhead" and opt[key] == 0:
                raise ClusterError(f"{where}.{key} must be > 0")
    eff = d.get("efficiency")
    if eff is not None:
        if not isinstance(eff, dict):
            raise ClusterError(f"{where}.efficiency must be an object like "
                               '{"compute": 0.5, "memory": 0.7}')
        _no_unknown(eff, ("compute", "memory"), f"{where}.efficiency")
        for k, v in eff.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ClusterError(f"{where}.efficiency.{k} must be a fraction in (0, 1], got {v!r}")
        eff = {k: float(v) for k, v in eff.items()}
    ops = d.get("unsupported_ops", [])
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ClusterError(f"{where}.unsupported_ops must be a list of op type names")
    machine = _str(d, "machine", where) if d.get("machine") is not None else None
    shared = d.get("shared_by", [])
    if not isinstance(shared, list) or not all(isinstance(o, str) and o for o in shared):
        raise ClusterError(f"{where}.shared_by must be a list of provider names "
                           "(e.g. [\"OpenVINORuntime\"])")
    if shared and klass != CPU_CLASS:
        raise ClusterError(f"{where}.shared_by: only the 'cpu' class shares its cores with "
                           "other providers")
    return DeviceSpec(name=name, cls=klass, count=count, execution_provider=ep, memory=memory,
                      efficiency=eff, unsupported_ops=tuple(ops), machine=machine,
                      shared_by=tuple(dict.fromkeys(shared)), **opt)


def _link(d: Any, where: str, classes: set[str]) -> LinkSpec:
    if not isinstance(d, dict):
        raise ClusterError(f"{where} must be an object")
    _no_unknown(d, _LINK_FIELDS, where)
    pair = d.get("between")
    if (not isinstance(pair, list) or len(pair) != 2
            or not all(isinstance(c, str) for c in pair)):
        raise ClusterError(f"{where}.between must be a list of two device classes, got {pair!r}")
    for c in pair:
        if c not in classes:
            raise ClusterError(f"{where}.between names class '{c}', which no device has "
                               f"(classes: {', '.join(sorted(classes))})")
    for key in ("bandwidth", "latency"):
        if key not in d:
            raise ClusterError(f"{where}: missing field '{key}'")
    bw = quantity(d["bandwidth"], "bytes/s", f"{where}.bandwidth")
    if not LINK_BANDWIDTH[0] <= bw <= LINK_BANDWIDTH[1]:
        raise ClusterError(f"{where}.bandwidth must be from 1kB/s to 1PB/s ({LINK_BANDWIDTH[0]:g} to "
                           f"{LINK_BANDWIDTH[1]:g} bytes/s), got {d['bandwidth']!r}")
    latency = quantity(d["latency"], "seconds", f"{where}.latency")
    if latency > LINK_LATENCY[1] or 0 < latency < LINK_LATENCY[0]:
        raise ClusterError(f"{where}.latency must be 0 or from 1ps to {LINK_LATENCY[1]:g} s, got {d['latency']!r}")
    return LinkSpec(pair[0], pair[1], bw, latency)
