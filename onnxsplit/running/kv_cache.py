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
