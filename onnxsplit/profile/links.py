"""Copy speeds between the host and each device present, and between two devices, measured
with onnxruntime's own copies rather than assumed: the detected cluster's links.

Host <-> device: an OrtValue made on the device from host memory and read back.  Device
<-> device: a one-node Identity session on one device whose input lives on the other
(its copy time less the same session's with the input already there).  Each is timed at
a small and a large size; the small one is the link's latency, the difference gives its
bandwidth (:func:`fit`).

Write-up: docs/machine.md (Cluster specs: detected links).
"""

from __future__ import annotations

import time
from typing import Callable

SMALL, LARGE = 4 << 10, 64 << 20  # bytes
REPEATS = 5


def fit(small_s: float, large_s: float, small: int = SMALL, large: int = LARGE) -> tuple[float, float] | None:
    """(bandwidth bytes/s, latency s) of a link from the median time of one copy at two
    sizes; None where the times say nothing (the large copy no slower than the small)."""
    if not (large_s > small_s >= 0):
        return None
    return (large - small) / (large_s - small_s), small_s


def median_time(copy: Callable[[], object], repeats: int = REPEATS) -> float:
    """Median seconds of ``copy()`` after one warm-up call."""
    copy()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        copy()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def host_link(device: str, device_id: int = 0) -> tuple[float, float] | None:
    """(bandwidth, latency) of one way between host memory and ``device``:``device_id``
    (an OrtValue device name, "cuda"), from round trips; None where it cannot be measured."""
    try:
        import numpy as np
        import onnxruntime as ort

        def round_trip(nbytes: int):
            data = np.ones(nbytes // 4, dtype=np.float32)
            return lambda: ort.OrtValue.ortvalue_from_numpy(data, device, device_id).numpy()

        small, large = (median_time(round_trip(n)) / 2 for n in (SMALL, LARGE))
    except Exception:  # no such device, or an onnxruntime without device OrtValues
        return None
    return fit(small, large)


def peer_link(ep: str, device: str, a: int, b: int) -> tuple[float, float] | None:
    """(bandwidth, latency) of a copy from device ``a`` to device ``b`` of one provider: an
    Identity session on ``b`` fed a tensor living on ``a``, less the same fed from ``b``."""
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper

        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
        model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "copy", [x], [y]),
                                  opset_imports=[helper.make_opsetid("", 13)])
        sess = ort.InferenceSession(onnx.shape_inference.infer_shapes(model).SerializeToString(),
                                    providers=[(ep, {"device_id": str(b)})])

        def run_from(where: int, nbytes: int):
            value = ort.OrtValue.ortvalue_from_numpy(np.ones(nbytes // 4, dtype=np.float32), device, where)
            binding = sess.io_binding()
            binding.bind_ortvalue_input("x", value)
            binding.bind_output("y", device, b)
            return lambda: sess.run_with_iobinding(binding)

        times = {n: median_time(run_from(a, n)) - median_time(run_from(b, n)) for n in (SMALL, LARGE)}
    except Exception:
        return None
    return fit(max(times[SMALL], 0.0), times[LARGE])
