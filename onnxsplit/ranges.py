"""Shape ranges: a split made for every shape between two corners, not for one shape.

``--input-shape input_ids=1..8x16..512`` gives each dimension a size or a range
``lo..hi``.  The plan is made at one shape of the range (the *planning shape*: the middle
of each range, or the shape given with ``@``, ``input_ids=1..8x16..512@1x128``), its parts
keep the model's dimension names, and the manifest records the range
(``model.shape_range``: each input's ``[lo, hi]`` per dimension) so that ``run`` and
``serve`` take any shape inside it and refuse one outside with one line.  The parts are
checked and timed at the *check shapes* (:func:`check_shapes`: the two corners and the
planning shape).  A shape is a dict of input name -> tuple of sizes throughout.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from .errors import OnnxsplitError

Range = dict[str, list[tuple[int, int]]]  # input -> (lo, hi) per dimension
Shapes = dict[str, tuple[int, ...]]


def parse_dims(spec: str, dims: str) -> tuple[list[tuple[int, int]], tuple[int, ...] | None]:
    """``"1..8x16..512@1x128"`` -> ([(1, 8), (16, 512)], (1, 128)); a fixed size is (n, n).
    One-line errors naming ``spec``."""
    example = "input_ids=1x128 or input_ids=1..8x16..512"
    text, at, planned = dims.partition("@")
    if text.strip() == "scalar":
        return [], () if at else None
    out = []
    for part in text.replace(",", "x").replace("X", "x").split("x"):
        lo, dots, hi = part.strip().partition("..")
        if not lo.strip().isdigit() or (dots and not hi.strip().isdigit()):
            raise OnnxsplitError(f"bad --input-shape '{spec}': DIMS must be non-negative integers or ranges "
                                 f"lo..hi separated by 'x' (or 'scalar'), e.g. {example}")
        a, b = int(lo), int(hi) if dots else int(lo)
        if a > b:
            raise OnnxsplitError(f"bad --input-shape '{spec}': the range {a}..{b} runs backwards")
        out.append((a, b))
    shape = None
    if at:
        parts = planned.replace("X", "x").split("x")
        if not all(p.strip().isdigit() for p in parts):
            raise OnnxsplitError(f"bad --input-shape '{spec}': the shape after '@' must be sizes, e.g. 1x128")
        shape = tuple(int(p) for p in parts)
        if problem := outside({"": out}, {"": shape}):
            raise OnnxsplitError(f"bad --input-shape '{spec}': the planning shape{problem[len(' input '):]}")
    return out, shape


def is_range(r: Mapping[str, list[tuple[int, int]]] | None) -> bool:
    """Whether any dimension of ``r`` spans more than one size."""
    return bool(r) and any(a != b for dims in r.values() for a, b in dims)


def middle(r: Range) -> Shapes:
    """Each range's geometric middle (cost grows with sizes multiplicatively), rounded."""
    return {k: tuple(a if a == b else max(a, min(b, round(math.sqrt(max(a, 1) * b)))) for a, b in dims)
            for k, dims in r.items()}


def corners(r: Range) -> tuple[Shapes, Shapes]:
    """The smallest and the largest shape of the range."""
    return ({k: tuple(a for a, _ in dims) for k, dims in r.items()},
            {k: tuple(b for _, b in dims) for k, dims in r.items()})


def check_shapes(r: Range, planned: Shapes) -> list[Shapes]:
    """Where the parts are verified and timed: the corners and the planning shape, each once."""
    out: list[Shapes] = []
    for s in (corners(r)[0], planned, corners(r)[1]):
        if s not in out:
            out.append(s)
    return out


def outside(r: Mapping[str, Any], shapes: Mapping[str, Iterable[int]]) -> str | None:
    """Why ``shapes`` is not in the range (one phrase), or None.  Inputs the range does
    not name are not judged here."""
    for name, dims in r.items():
        if name not in shapes:
            continue
        shape = list(shapes[name])
        who = f" input '{name}'" if name else ""
        if len(shape) != len(dims):
            return f"{who}: shape {shape} has {len(shape)} dimensions, the range {text(dims)} has {len(dims)}"
        for k, (n, (a, b)) in enumerate(zip(shape, dims)):
            if not a <= n <= b:
                return f"{who}: shape {shape}, dimension {k} is {n}, outside {text(dims)}"
    return None


def text(dims: Iterable[Iterable[int]]) -> str:
    """A range as --input-shape writes it: 1..8x128."""
    parts = [f"{a}" if a == b else f"{a}..{b}" for a, b in dims]
    return "x".join(parts) if parts else "scalar"


def as_json(r: Range) -> dict[str, list[list[int]]]:
    return {k: [[a, b] for a, b in dims] for k, dims in r.items()}


def from_json(value: Any) -> Range | None:
    """A manifest's ``model.shape_range``, or None where it has none; ValueError where it
    is not a range."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("must be an object of input -> [lo, hi] per dimension")
    out: Range = {}
    for name, dims in value.items():
        if not isinstance(dims, list) or not all(
                isinstance(d, list) and len(d) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in d) and 0 <= d[0] <= d[1] for d in dims):
            raise ValueError(f"'{name}' must be a list of [lo, hi] with 0 <= lo <= hi")
        out[name] = [(d[0], d[1]) for d in dims]
    return out


def follow_names(given: Mapping[str, tuple[int, ...]], inputs: Iterable[Mapping[str, Any]]) -> Shapes:
    """Every input's shape where some are given: an input not given takes the sizes of
    the dimensions it shares by name with one given (``dims``: the model's dimension
    names, as the manifest keeps them), and its own shape elsewhere."""
    size_of: dict[str, int] = {}
    specs = list(inputs)
    for s in specs:
        if s["name"] in given:
            for name, n in zip(s.get("dims") or (), given[s["name"]]):
                if isinstance(name, str) and name:
                    size_of.setdefault(name, int(n))
    out: Shapes = {}
    for s in specs:
        if s["name"] in given:
            out[s["name"]] = tuple(given[s["name"]])
        else:
            names = list(s.get("dims") or [None] * len(s["shape"]))
            out[s["name"]] = tuple(size_of.get(d, n) if isinstance(d, str) else n
                                   for d, n in zip(names, s["shape"]))
    return out


def complete(r: Mapping[str, list[tuple[int, int]]], dim_names: Mapping[str, list[str | None]],
             planned: Mapping[str, tuple[int, ...]]) -> Range:
    """The range of every input: one given a range keeps it; one not given takes the
    range of each dimension it shares by name (``dim_names``: the model's) with one given,
    else its planning shape.  Two inputs giving one named dimension different ranges is
    an error (the model could not run at the corners)."""
    by_name: dict[str, tuple[tuple[int, int], str]] = {}
    for k, dims in r.items():
        for d, span in zip(dim_names.get(k) or (), dims):
            if not d:
                continue
            seen = by_name.setdefault(d, (tuple(span), k))
            if seen[0] != tuple(span):
                raise OnnxsplitError(
                    f"--input-shape gives dimension '{d}' the range {text([seen[0]])} for '{seen[1]}' "
                    f"but {text([span])} for '{k}': the model names them as one size")
    sized: dict[str, tuple[int, str]] = {}
    for k, shape in planned.items():
        for d, n in zip(dim_names.get(k) or (), shape):
            if d and sized.setdefault(d, (n, k))[0] != n:
                raise OnnxsplitError(
                    f"--input-shape plans dimension '{d}' at {sized[d][0]} for '{sized[d][1]}' but at {n} "
                    f"for '{k}': the model names them as one size (give both the same shape after '@')")
    out: Range = {}
    for k, shape in planned.items():
        if k in r:
            out[k] = [tuple(span) for span in r[k]]
            continue
        names = list(dim_names.get(k) or [None] * len(shape))
        out[k] = [by_name[d][0] if d in by_name else (n, n) for d, n in zip(names, shape)]
    return out


def planning(r: Mapping[str, Any] | None, shapes: Mapping[str, Iterable[int]] | None) -> Shapes | None:
    """The shapes to plan at: ``shapes`` (checked to lie in ``r``), else the range's middle
    (the API's route; the command line's parse gives both)."""
    if not r:
        return dict(shapes) if shapes is not None else None
    r = {k: [(int(a), int(b)) for a, b in dims] for k, dims in r.items()}
    if any(a > b for dims in r.values() for a, b in dims):
        raise OnnxsplitError("shape_range: a range runs backwards (lo above hi)")
    out = dict(middle(r))
    out.update({k: tuple(v) for k, v in (shapes or {}).items()})
    if (why := outside(r, out)):
        raise OnnxsplitError(f"the planning shape lies outside the range:{why}")
    return out
