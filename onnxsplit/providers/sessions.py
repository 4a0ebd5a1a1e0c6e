"""A part's sessions on any provider, made in one place for the threaded runner, the
whole-model sessions it measures beside a plan, and Ray's actors.

Three kinds of provider run parts:

* onnxruntime's own execution providers, named in ``providers`` (the CPU EP after the
  first, for what the first does not take; ``device_id`` addresses one of several
  devices);
* plugin execution providers (``onnxsplit.providers.plugins``: OpenVINO's EP and others loaded from
  a library of their own), which a session takes as an EP device rather than by name;
* OpenVINO's own runtime (``onnxsplit.providers.openvino``), for a part whose manifest names it.

Every session has onnxruntime's ``run(outputs, feeds)``, ``get_inputs()``,
``get_outputs()`` and ``get_providers()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from . import openvino, plugins
from ..errors import OnnxsplitError
from ..profile.devices import CPU_EP


NO_SPIN = "session.intra_op.allow_spinning"  # "0": intra-op threads sleep between runs


def part_session_config(config: Mapping[str, Any] | None, meant: str, runs_on: str, threads: int | None,
                        beside_others: bool) -> dict[str, str]:
    """A part's session config (its manifest entry's) as it opens on ``runs_on``: without
    OpenVINO's properties where a part ``meant`` for OpenVINO falls back to a provider that
    does not know them, and with the intra-op threads kept from spinning where the part
    shares the cores ``beside_others`` (an idle part's threads must not spin on a core
    another needs; one thread has no pool, OpenVINO's runtime no such option)."""
    out = {k: str(v) for k, v in (config or {}).items()}
    if runs_on != meant == openvino.RUNTIME:
        out = {}
    if beside_others and threads != 1 and runs_on != openvino.RUNTIME:
        out = {NO_SPIN: "0", **out}
    return out


class SessionError(OnnxsplitError):
    """A provider refused a part (one line, naming the provider)."""


def open_sessions(path: str | Path, eps: list[str], *, threads: int | None, optimize: bool,
                  config: Mapping[str, Any] | None = None, copies: int = 1,
                  device_id: int | None = None,
                  shapes: Mapping[str, Iterable[int]] | None = None, served: bool = False) -> list[Any]:
    """``copies`` sessions of the model at ``path`` on ``eps`` (the first is the one it is
    meant for; onnxruntime puts what that one does not take on the next): ``threads``
    intra-op threads (0 or None: the provider's default), graph optimisations on where
    ``optimize``, ``config`` (session config entries; OpenVINO properties for its
    runtime).  ``shapes``: the input shapes the part was made for, where known (OpenVINO
    compiles for them; ``served``: for a server, every other shape runs on the model compiled
    once, at the start, with its dynamic dimensions).  SessionError naming the provider
    where it refuses."""
    first = eps[0]
    if first == openvino.RUNTIME:
        try:
            return openvino.open_sessions(path, threads=threads, replicas=copies, config=config,
                                          shapes=shapes, served=served)
        except openvino.OpenVINOError as e:
            raise SessionError(f"OpenVINO refused it: {e}") from None
    import onnxruntime as ort

    from ..profile.measure import session_options

    so = session_options(threads, optimize=optimize)
    plugin = first in plugins.providers()
    # (a plugin's provider options travel in the config as onnxruntime's ep.<name>.<option>)
    options, config = plugins.options_of(first, config or {}) if plugin else ({}, config or {})
    for k, v in config.items():
        so.add_session_config_entry(k, str(v))
    if plugin:
        try:
            plugins.add_to_session(so, first, {**options, **({"num_of_threads": threads} if threads else {})},
                                   index=device_id or 0)
        except Exception as e:
            raise SessionError(f"{first} cannot take it: {_one_line(e)}") from None
        providers: list = [CPU_EP]  # (the plugin's device comes first in the session)
    else:
        providers = list(dict.fromkeys(list(eps) + ([CPU_EP] if first != CPU_EP else [])))
        if device_id is not None and first != CPU_EP:
            providers[0] = (first, {"device_id": str(device_id)})
    out = []
    for _ in range(max(1, int(copies or 1))):
        try:
            # enable_fallback=0: onnxruntime would otherwise print to stdout and quietly
            # run the part on the CPU when the EP cannot be set up
            sess = ort.InferenceSession(str(path), so, providers=providers, enable_fallback=0) \
                if not plugin else ort.InferenceSession(str(path), so)
        except Exception as e:
            raise SessionError(_one_line(e)) from None
        out.append(sess)
    return out


def runs_on(sess) -> str:
    """The provider a session runs its part on (the first it was set up with)."""
    return sess.get_providers()[0]


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]
