"""Execution providers as devices: which are present, what hardware they drive, where
their tensors live.

Everything here is generic over onnxruntime's execution providers (EPs).  Only the CPU EP
can be exercised on a machine without accelerators; the tables below name what is known
about the others and every lookup has a generic fallback.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess

from ..limits import host_bytes

CPU_EP = "CPUExecutionProvider"

# Listed by onnxruntime but not a device: Azure sends requests to a remote endpoint.
NOT_DEVICES = frozenset({"AzureExecutionProvider"})

# EP -> OrtValue device type that holds its tensors (so that timing excludes host copies).
# EPs not listed take host tensors (OpenVINO, CoreML, QNN, XNNPACK, DNNL, ...).
ORTVALUE_DEVICE = {
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "cuda",
    "NvTensorRTRTXExecutionProvider": "cuda",
    "ROCMExecutionProvider": "cuda",
    "MIGraphXExecutionProvider": "cuda",
    "DmlExecutionProvider": "dml",
    "CANNExecutionProvider": "cann",
}

# EP -> device class a detected cluster gives it.
EP_CLASS = {
    "CUDAExecutionProvider": "gpu",
    "TensorrtExecutionProvider": "gpu",
    "NvTensorRTRTXExecutionProvider": "gpu",
    "ROCMExecutionProvider": "gpu",
    "MIGraphXExecutionProvider": "gpu",
    "DmlExecutionProvider": "gpu",
    "WebGpuExecutionProvider": "gpu",
    "OpenVINOExecutionProvider": "openvino",
    "QNNExecutionProvider": "npu",
    "VitisAIExecutionProvider": "npu",
    "CoreMLExecutionProvider": "coreml",
    "CANNExecutionProvider": "npu",
}

# For one device several EPs may be present (CUDA and TensorRT): the first listed here is
# the one a detected cluster uses (TensorRT builds an engine per node: slow to profile).
EP_PREFERENCE = ("CUDAExecutionProvider", "ROCMExecutionProvider", "DmlExecutionProvider",
                 "MIGraphXExecutionProvider", "TensorrtExecutionProvider")


# ONNXSPLIT_PROVIDERS=EP,...: the only providers onnxsplit uses beside the CPU EP (always
# kept: every part can fall back to it), for a user who deploys without one that is
# installed; the test suite runs with the CPU EP alone but where a test asks for more
PROVIDERS_ENV = "ONNXSPLIT_PROVIDERS"


def allowed_providers() -> set[str] | None:
    """The providers ONNXSPLIT_PROVIDERS allows (None: every one present)."""
    raw = os.environ.get(PROVIDERS_ENV, "").strip()
    if not raw:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()} | {CPU_EP}


def available_providers() -> list[str]:
    """Providers that run operators on this machine, CPU last: the EPs of this onnxruntime
    build, the plugin EPs that offer a device here (``onnxsplit.providers.plugins``), and OpenVINO's
    own runtime where it is installed (``onnxsplit.providers.openvino``); those
    ONNXSPLIT_PROVIDERS allows where it is set."""
    import onnxruntime as ort

    from ..providers import openvino, plugins

    loaded = plugins.register()
    # a plugin's library may register more names than its own: OpenVINO's also adds
    # 'OpenVINOExecutionProvider.AUTO' (its AUTO device over the same hardware), which
    # would otherwise pass for a device class of its own
    eps = [ep for ep in ort.get_available_providers()
           if ep not in NOT_DEVICES and ep.split(".")[0] not in loaded]
    eps += plugins.providers()  # (those that offer a device here)
    if openvino.available():
        eps.append(openvino.RUNTIME)
    allowed = allowed_providers()
    eps = [ep for ep in eps if allowed is None or ep in allowed]
    return [ep for ep in eps if ep != CPU_EP] + ([CPU_EP] if CPU_EP in eps else [])


def shares_cpu(ep: str) -> bool:
    """Whether ``ep`` runs on the host's cores, as the CPU EP does: OpenVINO's runtime, and
    a plugin EP whose device here is the CPU.  A plan counts those cores once, whichever
    provider runs a part on them."""
    from ..providers import openvino, plugins

    return ep in (CPU_EP, openvino.RUNTIME) or ep in plugins.cpu_providers()


def planned_on_cores() -> list[str]:
    """The providers beside the CPU EP that a detected cluster plans for on the cores:
    OpenVINO's own runtime where installed.  A plugin EP's CPU device (OpenVINO's EP, the
    same engine inside onnxruntime) is measured beside a plan by `run` and runs parts a
    cluster file's ``shared_by`` names, but is not planned for unless named."""
    from ..providers import openvino

    return [ep for ep in cpu_providers() if ep == openvino.RUNTIME]


def whole_on_cores() -> list[str]:
    """The providers on the host's cores that a plan weighs for the whole model only, beside
    onnxruntime's default session and copies: plugin EPs whose device is the CPU (OpenVINO's
    EP, whose whole-model calls measured faster than OpenVINO's own runtime on an Intel
    Xeon with AMX).  onnxruntime's profiler sees such an EP's compiled graph as one node,
    so there are no per-operator times to split on."""
    planned = planned_on_cores()
    return [ep for ep in cpu_providers() if ep not in planned]


def cpu_providers() -> list[str]:
    """The providers present that run on the host's cores besides the CPU EP."""
    return [ep for ep in available_providers() if ep != CPU_EP and shares_cpu(ep)]


def preferred_providers() -> list[str]:
    """One EP per device class present (the first of EP_PREFERENCE where a class has
    several: onnxruntime-gpu lists TensorRT beside CUDA, whether or not TensorRT's own
    libraries are installed), CPU last: the EPs a detected cluster uses, and those
    ``profile`` times unless told otherwise."""
    present = available_providers()
    rank = {ep: i for i, ep in enumerate(EP_PREFERENCE)}
    out, classes = [], set()
    for ep in sorted(present, key=lambda e: rank.get(e, len(rank))):
        if shares_cpu(ep):
            continue  # (the cores: the CPU EP; others that run on them are asked for by name)
        klass = EP_CLASS.get(ep, ep)
        if klass not in classes:
            classes.add(klass)
            out.append(ep)
    return [ep for ep in present if ep in out] + ([CPU_EP] if CPU_EP in present else [])


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.lru_cache(maxsize=None)
def _nvidia_smi(query: str) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_names() -> list[str]:
    return _nvidia_smi("name")


def device_count(ep: str) -> int | None:
    """How many devices this machine has for an execution provider that addresses them by
    ``device_id`` (NVIDIA's, counted by nvidia-smi); None where it cannot tell."""
    if ep in ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider"):
        return len(gpu_names())
    return None


def gpu_memory_bytes() -> list[int]:
    out = []
    for v in _nvidia_smi("memory.total"):  # MiB
        try:
            out.append(int(float(v)) * 1024 * 1024)
        except ValueError:
            pass
    return out


def _ep_hardware(ep: str) -> str:
    """What onnxruntime says the EP runs on (vendor and type), where it says."""
    try:
        import onnxruntime as ort

        for d in ort.get_ep_devices():
            if d.ep_name == ep:
                kind = str(d.device.type).rsplit(".", 1)[-1]
                return f"{d.device.vendor} {kind}".strip()
    except Exception:  # older onnxruntime: no EP device API
        pass
    return ""


def describe(ep: str) -> str:
    """The hardware an EP runs on, as specific as this machine tells (a profile's key);
    for OpenVINO's runtime, also the precision it computes in where not float32."""
    return _hardware(ep) + precision_note(ep)


def precision_note(ep: str, hardware: str | None = None) -> str:
    """What :func:`describe` adds for the precision ``ep`` computes in ('' in float32): in
    force now, or, given a profile entry's ``hardware``, what that entry was measured in."""
    from ..providers import openvino

    if ep not in (openvino.RUNTIME, openvino.PLUGIN_EP):  # (both compute in --precision)
        return ""
    if hardware is None:
        return openvino.hardware_note()
    at = hardware.find(openvino.PRECISION_NOTE)
    return hardware[at:] if at >= 0 else ""


@functools.lru_cache(maxsize=None)
def _hardware(ep: str) -> str:
    if ep == CPU_EP or ORTVALUE_DEVICE.get(ep) is None and EP_CLASS.get(ep) is None:
        return cpu_name()
    if ORTVALUE_DEVICE.get(ep) == "cuda" and gpu_names():
        return gpu_names()[0]
    return _ep_hardware(ep) or ep


def device_key(ep: str, threads: int = 1) -> str:
    """Identifies where a profile was measured: EP, hardware, threads per node."""
    return f"{ep}|{describe(ep)}|threads={threads}"


def host_memory_bytes() -> int:
    return host_bytes("MemTotal")


def provider_lines() -> list[str]:
    """One line per provider beyond onnxruntime's own that a user could run parts on: what
    it offers here, or why nothing (``onnxsplit devices``)."""
    from ..providers import openvino, plugins

    out = []
    allowed = allowed_providers()
    if allowed is not None:
        out.append(f"{PROVIDERS_ENV} allows only: {', '.join(sorted(allowed))}")
    if openvino.available():
        out.append(f"{openvino.RUNTIME}: OpenVINO {openvino.version()} on {openvino.device_name()}, "
                   f"sharing the CPU's cores with {CPU_EP}"
                   + ("; it computes in bf16 by default on this CPU, and so do onnxsplit's parts on it "
                      "(--precision f32 holds them to float32)" if openvino.bf16_units() else ""))
    else:
        out.append(f"{openvino.RUNTIME}: absent (pip install openvino, or 'onnxsplit[openvino]')")
    found = {p.name: p for p in plugins.plugins()}
    for ep, package in plugins.KNOWN.items():
        if ep not in found:
            out.append(f"{ep}: absent (pip install {package.replace('_', '-')}, or 'onnxsplit[openvino]')")
    for p in found.values():
        where = f"{p.name} ({p.source})"
        if not p.devices:
            out.append(f"{where}: {p.why_none}")
            continue
        devs = ", ".join(f"{d['type']} {d['vendor']}".strip() for d in p.devices)
        cpu = any(d["type"] == "cpu" for d in p.devices)
        out.append(f"{where}: {devs}" + (f"; its cpu device shares the cores with {CPU_EP} (planned "
                                         "for where a cluster file's shared_by names it)" if cpu else "")
                   + ("; its gpu/npu devices are listed, not planned for" if any(
                       d["type"] != "cpu" for d in p.devices) else ""))
    return out
