"""Profiles and the JSON file that caches them.

A profile file holds any number of *entries*, each the per-node timings of one model
(keyed by a hash of its graph without weight data, its bound input shapes and fills) on
one device (execution provider, hardware, threads).  So one file can carry a model's
timings from a GPU server and from a laptop, and looking up (model, device) is a cache
hit that runs nothing.  The file format, field by field: docs/machine.md ("Profile files").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import onnx
from onnx import TensorProto

from ..errors import ProfileError
from ..files import loads, write_atomic

FORMAT = "onnxsplit-profile"
VERSION = 1
_SMALL_INIT_BYTES = 1024  # initializers this small are hashed with their values (shapes)


@dataclass(frozen=True)
class NodeTiming:
    op_type: str
    supported: bool = True
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    same_as: str | None = None
    error: str | None = None

    @property
    def measured(self) -> bool:
        return self.supported and self.median_ms is not None

    def to_json(self) -> dict:
        d: dict = {"op_type": self.op_type, "supported": self.supported}
        for k in ("median_ms", "p10_ms", "p90_ms", "same_as", "error"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        return d

    @classmethod
    def from_json(cls, d: dict) -> "NodeTiming":
        """ValueError where a time is not a finite number >= 0 (a damaged entry)."""
        times = {k: d.get(k) for k in ("median_ms", "p10_ms", "p90_ms")}
        for k, v in times.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not 0 <= v < float("inf")):
                raise ValueError(f"{k} {v!r} is not a time")
        return cls(op_type=d.get("op_type", ""), supported=bool(d.get("supported", True)),
                   same_as=d.get("same_as"), error=d.get("error"), **times)


@dataclass(frozen=True)
class Entry:
    """One model's timings on one device."""

    model_hash: str
    input_shapes: Mapping[str, tuple[int, ...]]
    device_key: str
    execution_provider: str
    nodes: Mapping[str, NodeTiming]
    whole_model_ms: Mapping[str, float] = field(default_factory=dict)
    call_overhead_ms: float = 0.0
    node_overhead_ms: float = 0.0
    model: Mapping = field(default_factory=dict)  # path, node count: informational
    device: Mapping = field(default_factory=dict)  # hardware, host, threads, versions
    settings: Mapping = field(default_factory=dict)
    measured_at: str = ""
    seconds: float = 0.0
    # the whole model as users run onnxruntime, measured beside the nodes (calibrate.py)
    as_run: Mapping = field(default_factory=dict)

    @property
    def hardware(self) -> str:
        return str(self.device.get("hardware", ""))

    def node_sum_ms(self) -> float:
        return sum(t.median_ms for t in self.nodes.values() if t.median_ms is not None)

    def to_json(self) -> dict:
        return {
            "model": {"hash": self.model_hash,
                      "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
                      **{k: v for k, v in self.model.items() if k not in ("hash", "input_shapes")}},
            "device": {"key": self.device_key, "execution_provider": self.execution_provider,
                       **{k: v for k, v in self.device.items()
                          if k not in ("key", "execution_provider")}},
            "settings": dict(self.settings),
            "measured_at": self.measured_at,
            "seconds": self.seconds,
            "call_overhead_ms": self.call_overhead_ms,
            "node_overhead_ms": self.node_overhead_ms,
            "whole_model_ms": dict(self.whole_model_ms),
            **({"as_run": dict(self.as_run)} if self.as_run else {}),
            "nodes": {name: t.to_json() for name, t in self.nodes.items()},
        }

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Entry":
        try:
            model, device = d["model"], d["device"]
            return cls(
                model_hash=str(model["hash"]),
                input_shapes={k: tuple(int(x) for x in v) for k, v in model["input_shapes"].items()},
                device_key=str(device["key"]),
                execution_provider=str(device["execution_provider"]),
                nodes={k: NodeTiming.from_json(v) for k, v in d["nodes"].items()},
                whole_model_ms=dict(d.get("whole_model_ms") or {}),
                call_overhead_ms=float(d.get("call_overhead_ms", 0.0)),
                node_overhead_ms=float(d.get("node_overhead_ms", 0.0)),
                model={k: v for k, v in model.items() if k not in ("hash", "input_shapes")},
                device={k: v for k, v in device.items() if k not in ("key", "execution_provider")},
                settings=dict(d.get("settings") or {}),
                measured_at=str(d.get("measured_at", "")),
                seconds=float(d.get("seconds", 0.0)),
                as_run=dict(d.get("as_run") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise ProfileError(f"{where}: malformed entry ({what})") from None


@dataclass
class ProfileFile:
    """The entries of one profile file (possibly none yet)."""

    path: Path | None
    entries: list[Entry] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path, *, missing_ok: bool = True) -> "ProfileFile":
        path = Path(path)
        if not path.exists():
            if missing_ok:
                return cls(path)
            raise ProfileError(f"profile file '{path}' does not exist")
        return cls(path, [Entry.from_json(e, f"{path}: entries[{i}]")
                          for i, e in enumerate(_raw_entries(path))])

    @classmethod
    def load_cache(cls, path: str | Path, model_hash: str | None = None,
                   node_names: Sequence[str] | None = None) -> "ProfileFile":
        """The per-user cache file at ``path``, which onnxsplit alone writes: what cannot
        be used is set aside with a note on stderr, and measured again by the caller --
        a file that is not a profile is renamed ``*.corrupt`` (kept, not deleted), a
        malformed entry dropped, and an entry of ``model_hash`` whose nodes are not
        ``node_names`` (another model's timings under its key) dropped.  What was dropped
        is saved at once, so that the next read is clean."""
        path = Path(path)
        if not path.exists():
            return cls(path)
        try:
            entries = _raw_entries(path)
        except ProfileError as e:
            aside = path.with_name(f"{path.name}.corrupt")
            try:
                path.replace(aside)
            except OSError:
                raise e from None
            _note(f"{e}; set aside as {aside}, measuring again")
            return cls(path)
        kept, dropped = [], []
        names = set(node_names) if node_names is not None else None
        for i, raw in enumerate(entries):
            try:
                e = Entry.from_json(raw, f"{path}: entries[{i}]")
            except ProfileError as err:
                dropped.append(str(err))
                continue
            if names is not None and e.model_hash == model_hash and set(e.nodes) != names:
                dropped.append(f"{path}: entries[{i}] ({e.execution_provider}) times other nodes "
                               "than the model has")
                continue
            kept.append(e)
        store = cls(path, kept)
        for why in dropped:
            _note(f"{why}: dropped, measuring again")
        if dropped:
            try:
                store.save()
            except OSError:
                pass  # (a read-only cache: used as read, not cleaned)
        return store

    def find(self, model_hash: str, device_key: str) -> Entry | None:
        for e in self.entries:
            if e.model_hash == model_hash and e.device_key == device_key:
                return e
        return None

    def for_model(self, model_hash: str) -> list[Entry]:
        return [e for e in self.entries if e.model_hash == model_hash]

    def put(self, entry: Entry) -> None:
        self.entries = [e for e in self.entries
                        if (e.model_hash, e.device_key) != (entry.model_hash, entry.device_key)]
        self.entries.append(entry)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "entries": [e.to_json() for e in self.entries]}

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path or self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")
        self.path = path
        return path


@dataclass(frozen=True)
class ModelProfile:
    """Every entry known for one model: what the workload builder reads."""

    model_hash: str
    input_shapes: Mapping[str, tuple[int, ...]]
    entries: tuple[Entry, ...]
    fresh: tuple[str, ...] = ()  # EPs measured by the call that returned this (not cached)
    path: Path | None = None  # the profile file it was read from / written to

    def providers(self) -> list[str]:
        return list(dict.fromkeys(e.execution_provider for e in self.entries))

    def entry(self, execution_provider: str, *, host: str | None = None,
              hardware: str | None = None) -> Entry | None:
        """The entry for an EP: the most recent one measured on ``host`` if any, else on
        ``hardware`` if any, else the most recent -- of those that computed in the precision
        in force (OpenVINO's float32 and bf16 figures never stand in for each other:
        :func:`devices.precision_note`)."""
        from .devices import precision_note

        note = precision_note(execution_provider)
        mine = [e for e in self.entries if e.execution_provider == execution_provider
                and precision_note(execution_provider, e.hardware) == note]
        for want, of in ((host, lambda e: e.device.get("host")), (hardware, lambda e: e.hardware)):
            if want is not None and any(of(e) == want for e in mine):
                mine = [e for e in mine if of(e) == want]
                break
        return max(mine, key=lambda e: e.measured_at) if mine else None


def _raw_entries(path: Path) -> list:
    """A profile file's entries as JSON; ProfileError where it is not a profile file."""
    if path.exists() and not (path.is_file() or path.is_dir()):
        # a pipe or a device: reading it would wait for a writer, or never end
        raise ProfileError(f"'{path}' is not a profile file (not a regular file)")
    try:
        data = loads(path.read_text())
    except OSError as e:
        raise ProfileError(f"cannot read profile file '{path}': {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"'{path}' is not a profile file (not JSON: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"'{path}' is not a profile file (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ProfileError(f"'{path}' is a profile of version {data.get('version')!r}; "
                           f"this onnxsplit reads version {VERSION}")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ProfileError(f"'{path}': field 'entries' must be a list")
    return entries


def _note(text: str) -> None:
    import sys

    print(f"onnxsplit: note: {text}", file=sys.stderr, flush=True)


def model_hash(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]]) -> str:
    """SHA-256 of the graph without weight data, the opsets and the bound input shapes.

    Weights enter with name, type and dims only (so a profile survives fine-tuning, and
    hashing never copies or reads gigabytes); initializers of at most 1 KB keep their
    values, since those are the shape constants that Reshape and friends read.  Declared
    value_info is left out: exporters differ in what they record, and it is derived data.
    """
    from ..shapes import proto_bytes

    h = hashlib.sha256()

    def put(msg) -> None:
        data = msg.SerializeToString(deterministic=True)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    def put_tensor(t: TensorProto) -> None:
        if t.data_location != TensorProto.EXTERNAL and proto_bytes(t) <= _SMALL_INIT_BYTES:
            put(t)
        else:
            put(TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims)))

    def put_graph(g: onnx.GraphProto) -> None:
        for vi in list(g.input) + list(g.output):
            put(vi)
        for t in g.initializer:
            put_tensor(t)
        for sp in g.sparse_initializer:
            put_tensor(sp.values)
            put(TensorProto(name=sp.indices.name, data_type=sp.indices.data_type,
                            dims=list(sp.indices.dims)))
        for n in g.node:
            subgraphs = [a for a in n.attribute
                         if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)]
            if not subgraphs:
                put(n)
                continue
            shell = onnx.NodeProto()
            shell.CopyFrom(n)
            del shell.attribute[:]
            shell.attribute.extend(a for a in n.attribute if a not in subgraphs)
            put(shell)
            for a in subgraphs:
                h.update(a.name.encode())
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    put_graph(sub)

    for o in model.opset_import:
        put(o)
    for f in model.functions:
        put(f)
    put_graph(model.graph)
    shapes = json.dumps({k: list(v) for k, v in sorted(input_shapes.items())})
    h.update(shapes.encode())
    return h.hexdigest()


def profile_key(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]],
                fills: Mapping[str, float] | None = None) -> str:
    """What a profile is keyed by: :func:`model_hash`, and the input ``fills`` (values that
    steer control flow) where there are any."""
    key = model_hash(model, input_shapes)
    if fills:
        key = hashlib.sha256((key + json.dumps(sorted(fills.items()))).encode()).hexdigest()
    return key
