"""The check: do the parts reproduce the original model?

The parts' outputs on one sample are compared with the original model's, run as the
reference (one thread, graph optimisations off), output by output.  What counts as a
real difference is grounded in the model itself: onnxruntime's own configurations
(optimised or not, one thread or all) already move a model's outputs a little -- sums
taken in another order -- and a plan's parts run in those configurations.  So each
float output is allowed the largest of

* ABS_TOLERANCE (absolute, for outputs near zero),
* SPREAD_FACTOR times how far the original's own outputs moved between onnxruntime's
  configurations on the same inputs (:func:`reference`), and
* its largest magnitude times a relative tolerance: REL_TOLERANCE in float32 on the CPU,
  ACCELERATOR_REL_TOLERANCE where a part ran on another provider's kernels (TF32 on
  CUDA, OpenVINO's) or the output is a half-precision float.

Parts OpenVINO ran in bf16 (``--precision bf16``: the manifest's ``precision``) may also
move each output REDUCED_FACTOR times as far as the whole model moves when OpenVINO runs it
in that precision (:func:`reduced_spread`): as accurate as the user's alternative, not
more, and no looser.

An output whose allowed error, so grounded, reaches UNCHECKABLE_SHARE of its largest value
cannot be checked (a numerically chaotic model): the check fails and says so, since parts
computing garbage would pass it.

Integer and boolean outputs must be equal; a NaN anywhere fails (the original's too: a
NaN compares with nothing, and weights that make one must not pass), as does an infinity
the original does not have, and a check that compared no value at all (every output
empty).  Wrong wiring, zeroed or garbage weights give errors of the outputs' own size;
a part computing with subtly corrupted weights moves its outputs far more than a
summation order does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

# the absolute floor, for an output whose values are all near zero (a bar of 1e-4 alone let
# one weight of an MLP moved by 0.2% pass: its outputs moved by 1.3e-5)
ABS_TOLERANCE = 1e-6
# the float32 relative floor: some 30 roundings (float32 epsilon) of the largest value; a
# ResNet-50 split whose parts summed in another order was off by 1.1e-6 of its largest logit
REL_TOLERANCE = 4e-6
# how far beyond the model's own spread between onnxruntime configurations a part may be
SPREAD_FACTOR = 10.0
# Parts on an accelerator compute with its kernels, not the CPU's: onnxruntime's CUDA EP does
# float32 matrix products in TF32 by default (its use_tf32 option), so outputs differ from
# the CPU's in the third or fourth digit. Measured on an H100 against the CPU: max rel error
# 6e-5 (models/small_bert, 1x64), 1.1e-3 (BERT-base, 1x128; max abs 2.8e-3). A wrong
# wiring of the parts gives errors of the outputs' own size.
ACCELERATOR_REL_TOLERANCE = 1e-2
# how far beyond the whole model's own move in OpenVINO's bf16 a part computing in it may be
REDUCED_FACTOR = 3.0
# an output whose allowed error, grounded in the model's own move, reaches this share of its
# largest value cannot be checked: parts computing garbage would pass (a model that scales by
# 1e7 then takes Sin moves by as much as its values between onnxruntime's configurations)
UNCHECKABLE_SHARE = 0.25
HALF = ("float16", "bfloat16")


class ShapeMismatch(ValueError):
    """An output of the parts has another shape than the original's."""


def compare_outputs(got: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """Largest absolute difference over all outputs, and the largest per output relative to
    that output's largest magnitude (so values near zero do not blow it up); per output
    (``per_output``): its difference, its largest magnitude and whether it is a float of
    half precision.  A shape that differs raises ShapeMismatch."""
    abs_err, rel_err, worst = 0.0, 0.0, None
    per: dict[str, dict[str, Any]] = {}
    for name, ref in want.items():
        a, b = np.asarray(got[name]), np.asarray(ref)
        if a.shape != b.shape:
            raise ShapeMismatch(f"output '{name}' has shape {a.shape} from the parts but {b.shape} "
                             "from the original model")
        if a.dtype.kind in "fc" or b.dtype.kind in "fc":
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            with np.errstate(invalid="ignore"):  # (inf - inf: a NaN, an error below)
                diff = np.abs(a64 - b64)
            # an infinity where the original has the same is agreement; a NaN (in either)
            # or any other infinity is an error no tolerance accepts (max() would drop a NaN)
            same = a64 == b64
            diff = np.where(same, 0.0, np.where(np.isfinite(diff), diff, np.inf))
            d = float(np.max(diff, initial=0.0))
            finite = np.abs(b64[np.isfinite(b64)])
            scale = float(np.max(finite, initial=0.0))
            kind = "half" if str(b.dtype) in HALF else "float"
        else:
            d = 0.0 if np.array_equal(a, b) else float("inf")
            scale, kind = 1.0, "exact"
        r = d / scale if scale > 0 else (0.0 if d == 0 else float("inf"))
        per[name] = {"abs": d, "scale": scale, "kind": kind, "size": int(b.size)}
        if kind != "exact":
            nan = (int(np.isnan(a.astype(np.float64)).sum()), int(np.isnan(b.astype(np.float64)).sum()))
            if any(nan):
                per[name]["nan"] = {"parts": nan[0], "original": nan[1]}
        if d > abs_err:
            worst = name
        abs_err, rel_err = max(abs_err, d), max(rel_err, r)
    half = any(p["kind"] == "half" for p in per.values())
    return {"max_abs_error": abs_err, "max_rel_error": rel_err, "worst_output": worst,
            "outputs": len(want), "half_precision": half, "per_output": per}


def spread(outputs: list[Mapping[str, Any]], want: Mapping[str, Any]) -> dict[str, float]:
    """Per float output, the largest difference of any of ``outputs`` (the original model
    in other onnxruntime configurations) from ``want``."""
    out: dict[str, float] = {}
    for other in outputs:
        for name, p in compare_outputs(other, want)["per_output"].items():
            if p["kind"] != "exact" and np.isfinite(p["abs"]):
                out[name] = max(out.get(name, 0.0), p["abs"])
    return out


def tolerance(verify: Mapping[str, Any], accelerated: bool,
              own: Mapping[str, float] | None = None,
              reduced: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Whether ``verify`` (:func:`compare_outputs`) is close enough (see the module
    docstring; ``own``: the original model's own spread per output, :func:`spread`;
    ``reduced``: :func:`reduced_spread`'s, where parts computed in bf16): ``ok``, the
    ``tolerance`` in its old terms (the absolute floor, and the relative one where it
    applies) and ``allowed`` per output with why (``abs``, ``spread``, ``relative`` or
    ``reduced``)."""
    own = own or {}
    low = (reduced or {}).get("spread") or {}
    rel_any = accelerated or bool(verify.get("half_precision"))
    tol: dict[str, float] = {"max_abs_error": ABS_TOLERANCE}
    if rel_any:
        tol["max_rel_error"] = ACCELERATOR_REL_TOLERANCE
    per = verify.get("per_output")
    if per is None:  # (an aggregate alone: the floors)
        ok = verify["max_abs_error"] <= ABS_TOLERANCE or (
            rel_any and verify["max_rel_error"] <= ACCELERATOR_REL_TOLERANCE)
        return {"tolerance": tol, "ok": bool(ok)}
    allowed: dict[str, dict[str, Any]] = {}
    ok = sum(p.get("size", 1) for p in per.values()) > 0  # (no value compared: nothing confirmed)
    for name, p in per.items():
        if p["kind"] == "exact":
            allowed[name] = {"abs": 0.0, "why": "exact"}
            ok &= p["abs"] == 0.0
            continue
        rel = ACCELERATOR_REL_TOLERANCE if (accelerated or p["kind"] == "half") else REL_TOLERANCE
        options = {"abs": ABS_TOLERANCE, "spread": SPREAD_FACTOR * own.get(name, 0.0),
                   "relative": rel * p["scale"], "reduced": REDUCED_FACTOR * low.get(name, 0.0)}
        why = max(options, key=options.get)
        allowed[name] = {"abs": options[why], "why": why}
        ok &= p["abs"] <= options[why]
        if why in ("spread", "reduced") and options[why] > ABS_TOLERANCE and \
                options[why] >= UNCHECKABLE_SHARE * p["scale"]:
            allowed[name]["uncheckable"] = True  # (the model's own move is as large as its values)
            ok = False
    return {"tolerance": tol, "ok": bool(ok), "allowed": allowed,
            **({"spread": dict(own)} if own else {}), **({"reduced": dict(reduced)} if reduced else {})}


def reference(model_path: str | Path, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """The original model's outputs on ``feeds`` as the reference (one thread, graph
    optimisations off), and how far its outputs move in onnxruntime's default session (all
    optimisations, every core) -- run one after the other, one session held at a time.
    RunError where the model cannot be loaded or fails on the inputs."""
    from ..errors import RunError
    from ..profile.devices import CPU_EP
    from ..providers.sessions import SessionError, open_sessions

    outs = []
    for threads, optimize in ((1, False), (0, True)):
        try:
            sess = open_sessions(model_path, [CPU_EP], threads=threads, optimize=optimize)[0]
        except SessionError as e:
            raise RunError(f"the original model '{model_path}' cannot be loaded: {e}") from None
        try:
            outs.append(dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(feeds)))))
        except Exception as e:
            raise RunError(f"the original model failed on the check inputs: "
                           f"{' '.join(str(e).split())[:300]}") from None
        sess = None
    return outs[0], spread(outs[1:], outs[0])


def reduced_spread(model_path: str | Path, feeds: Mapping[str, Any], want: Mapping[str, Any],
                   precision: str) -> dict[str, Any]:
    """How far the whole model's outputs move from ``want`` (the reference) when OpenVINO
    runs it computing in ``precision``, as its users run it there: {precision, spread:
    output -> largest difference}.  Where OpenVINO's runtime refuses the model (an
    operator it has no rule for), onnxruntime with OpenVINO's EP runs it, as parts on that
    EP do (the EP hands such operators to the CPU EP).  RunError where neither can."""
    import json

    from ..errors import RunError
    from ..providers import openvino, plugins
    from ..providers.sessions import open_sessions

    tries = [lambda: openvino.open_sessions(model_path, threads=0,
                                            config={"INFERENCE_PRECISION_HINT": precision})[0]]
    if plugins.ep_devices(openvino.PLUGIN_EP):
        load = json.dumps({openvino.DEVICE: {"INFERENCE_PRECISION_HINT": precision}})
        tries.append(lambda: open_sessions(model_path, [openvino.PLUGIN_EP], threads=0, optimize=True,
                                           config=plugins.as_config(openvino.PLUGIN_EP, {"load_config": load}))[0])
    first = None
    for opened in tries:
        try:
            sess = opened()
            got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(feeds))))
            return {"precision": precision, "spread": spread([got], want)}
        except Exception as e:
            first = first or e
    raise RunError(f"OpenVINO cannot run the original model in {precision} to ground the check: "
                   f"{' '.join(str(first).split())[:300]}") from None


def failed(verify: Mapping[str, Any]) -> str:
    """A failed check in words: its largest errors, the tolerance and what else it saw; or
    the output it could not check at all."""
    for name, a in (verify.get("allowed") or {}).items():
        if a.get("uncheckable"):
            scale = verify["per_output"][name]["scale"]
            share = f"{a['abs'] / scale:.0%} of its largest value" if scale > 0 else "and its values are 0"
            return (f"the check cannot tell whether the parts reproduce the model: output '{name}' may be off by "
                    f"{a['abs']:.2g} ({says({**verify, 'worst_output': name})}), {share}; the model is this "
                    "sensitive to the order of its sums")
    return (f"the parts do not reproduce the model (max abs error {verify['max_abs_error']:.2g}, max rel "
            f"error {verify['max_rel_error']:.2g} -- above {says(verify)}{why_not(verify)})")


def why_not(verify: Mapping[str, Any]) -> str:
    """What a failed check saw beyond its largest error, in words ('' where nothing more):
    NaNs, and where they came from, or no value compared at all."""
    per = verify.get("per_output")
    if per is not None and sum(p.get("size", 1) for p in per.values()) == 0:
        return "; nothing was compared: every output is empty at the check's shapes"
    for name, p in (per or {}).items():
        if "nan" in p:
            n = p["nan"]
            whose = "the original model's too" if n["original"] else "the original model has none"
            return f"; {n['parts']} NaN(s) in output '{name}' ({whose})"
    return ""


def says(verify: Mapping[str, Any]) -> str:
    """The tolerance a check was held to, in words, for its worst output."""
    allowed = verify.get("allowed") or {}
    worst = verify.get("worst_output")
    if worst in allowed:
        a = allowed[worst]
        why = {"abs": "absolute", "exact": "exact",
               "spread": f"{SPREAD_FACTOR:g}x the {verify.get('spread', {}).get(worst, 0):.2g} the "
                         "model's own output moves between onnxruntime's configurations",
               "relative": "relative to its largest value",
               "reduced": f"{REDUCED_FACTOR:g}x the {(verify.get('reduced') or {}).get('spread', {}).get(worst, 0):.2g} "
                          f"the whole model's output moves when OpenVINO computes it in "
                          f"{(verify.get('reduced') or {}).get('precision')}"}[a["why"]]
        return f"{a['abs']:.2g} on '{worst}' ({why})"
    return " or ".join(f"{v:g} {k.split('_')[1]}" for k, v in verify["tolerance"].items())
