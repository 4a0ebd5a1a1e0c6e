"""KV caches kept in place between decoding steps, as onnxruntime-genai keeps them.

Where every cache of a decoder's parts is read by onnxruntime's ``GroupQueryAttention``
(onnxruntime-genai's builder writes that layout), the attention takes its past and its
present in one buffer: it writes the step's keys and values at their positions (what the
attention mask says has been seen) and reads the positions before them.  Each cache is then
one buffer of the generation's whole length, allocated once on its part's device and bound
with onnxruntime's IOBinding as both the part's past input and its present output; nothing
about a cache is copied or handed through Python between steps, and what one part hands the
next stays an OrtValue.  (Attention that concatenates past and present, as Optimum's export
does, makes a new present each step: :mod:`generate` hands those on as arrays, which
measured faster on this CPU than binding a fresh output each step.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import RunError

SHARED_OP = ("com.microsoft", "GroupQueryAttention")
CUDA_EP = "CUDAExecutionProvider"
# generations one part keeps caches for at once (the gateway works on far fewer: a leak's cap)
KEPT_GENERATIONS = 64


def shared_caches(parts, caches: Mapping[str, str]) -> str | None:
    """Why the parts' caches cannot share past and present (None where they can): every
    past input must be read by a GroupQueryAttention in the part that takes it, and its
    present made by the same part."""
    import onnx

    for i, p in enumerate(parts.parts):
        inputs, outputs = parts.io(i)
        mine = [c for c in caches if c in inputs]
        if not mine:
            continue
        missing = [c for c in mine if caches[c] not in outputs]
        if missing:
            return f"cache '{missing[0]}' is read by part {p['name']}, which does not make its present"
        graph = onnx.load(str(Path(parts.dir) / p["file"]), load_external_data=False).graph
        read = {x for n in graph.node if (n.domain, n.op_type) == SHARED_OP for x in n.input}
        other = [c for c in mine if c not in read]
        if other:
            return f"cache '{other[0]}' is not read by a GroupQueryAttention"
    return None


def kept_why(specs, caches: Mapping[str, str]) -> str | None:
    """Why parts (the manifest's specs) cannot keep their caches between a generation's
    calls in their own replicas (None where they can): each part one replica (a call of a
    part with copies goes to any of them), and each cache read by the part that makes its
    present."""
    for p in specs:
        if int(p.get("replicas") or 1) > 1:
            return f"part {p['name']} runs as {p['replicas']} copies"
        inputs = {t["name"] for t in p["inputs"]}
        outputs = {t["name"] for t in p["outputs"]}
        other = [c for c in caches if c in inputs and caches[c] not in outputs]
        if other:
            return f"cache '{other[0]}' is read by part {p['name']}, which does not make its present"
    return None


class SharedCaches:
    """``run(feeds) -> outputs by name`` for :func:`generate.generate` over ``parts`` whose
    caches share past and present (:func:`shared_caches`): the caches in ``feeds`` are not
    read (each is its buffer, bound in place), and each returned ``present`` is its buffer.
    ``length``: the most positions a generation holds (its prompt and new tokens)."""

    def __init__(self, parts, caches: Mapping[str, str], specs: Mapping[str, Mapping[str, Any]],
                 seq_axis: Mapping[str, int], length: int):
        import onnxruntime as ort

        self.parts = parts
        self.caches = dict(caches)
        self.bindings = []
        self.devices = []
        self.buffers: dict[str, Any] = {}
        for i, p in enumerate(parts.parts):
            sess = parts.sessions[i][0]
            cuda = parts.execution_providers[i] == CUDA_EP
            device = ("cuda", int(p.get("device_id") or 0)) if cuda else ("cpu", 0)
            self.devices.append(device)
            self.bindings.append(sess.io_binding())
            for past in (c for c in caches if c in parts.io(i)[0]):
                shape = list(specs[past]["shape"])
                shape[seq_axis[past]] = length
                zeros = np.zeros(shape, dtype=specs[past].get("dtype", "float32"))
                self.buffers[past] = ort.OrtValue.ortvalue_from_numpy(zeros, *device)
        self.length = length

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {k: v for k, v in feeds.items() if k not in self.caches}
        presents = {present: past for past, present in self.caches.items()}
        for i, p in enumerate(self.parts.parts):
            io = self.bindings[i]
            io.clear_binding_inputs()
            io.clear_binding_outputs()
            inputs, outs = self.parts.io(i)
            for name in inputs:
                if name in self.buffers:
                    io.bind_ortvalue_input(name, self.buffers[name])
                elif isinstance(values.get(name), np.ndarray):
                    io.bind_cpu_input(name, np.ascontiguousarray(values[name]))
                elif name in values:
                    io.bind_ortvalue_input(name, values[name])
                else:
                    raise RunError(f"part {p['name']} takes '{name}', which no part before it made")
            for name in outs:
                if name in presents:
                    io.bind_ortvalue_output(name, self.buffers[presents[name]])
                else:
                    io.bind_output(name, *self.devices[i])
            try:
                self.parts.sessions[i][0].run_with_iobinding(io)
            except Exception as e:
                raise RunError(f"part {p['name']} on {p['device']} failed: "
                               f"{' '.join(str(e).split())[:300]}") from None
            values.update(zip(outs, io.get_outputs()))
        return {o: (values[o].numpy() if o not in presents else values[o])
                for o in self.parts.output_names}


class KeptCaches:
    """One part's caches for each generation in flight, kept in the part's process between
    its calls (``serve --engine ray`` across several parts: a step sends each part what the
    parts before it made, never a cache; :func:`kept_why` says where they can).  ``part``:
    the part as :class:`SharedCaches` reads a loaded parts folder (one part); ``decoder``:
    :class:`..generate.Decoder`.  In place (one buffer a cache) where ``shared`` (the part
    allows it: :func:`shared_caches`), else each call's presents kept as ``run(feeds)``,
    the part's own call, returned them."""

    def __init__(self, part, decoder, shared: bool, run, most: int = KEPT_GENERATIONS):
        self.part, self.decoder, self.shared, self._run, self.most = part, decoder, shared, run, most
        self.caches = {past: present for past, present in decoder.caches.items() if past in part.io(0)[0]}
        self.open: dict[str, Any] = {}  # generation -> its SharedCaches, or its presents by past (oldest first)

    def run(self, generation: str, first: bool, length: int, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The part's outputs but its presents for one call of ``generation`` (``first``:
        its first call, whose feeds hold the empty past; ``length``: its most positions)."""
        name = self.part.parts[0]["name"]
        if first:
            if len(self.open) >= self.most:  # (a gateway that never ended them): the oldest goes
                self.open.pop(next(iter(self.open)))
            self.open[generation] = SharedCaches(
                self.part, self.caches, self.decoder.specs, {c: self.decoder.seq_axis(c) for c in self.caches},
                length) if self.shared else {past: feeds[past] for past in self.caches}
        state = self.open.get(generation)
        if state is None:
            raise RunError(f"part {name} holds no caches for this generation (its replica restarted, or "
                           f"more than {self.most} generations ran at once)")
        self.open[generation] = self.open.pop(generation)  # (now the newest)
        presents = set(self.caches.values())
        if self.shared:
            got = state.run(feeds)
        else:
            got = self._run({**feeds, **state})
            state.update({past: got[present] for past, present in self.caches.items()})
        return {o: v for o, v in got.items() if o not in presents}

    def end(self, generation: str) -> None:
        """The generation's caches let go (it finished, failed or was given up)."""
        self.open.pop(generation, None)
