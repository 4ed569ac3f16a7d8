"""What changed between two runs' settings, for `gpuprof compare`: run.config's keys (nested ones
dotted) and what the matmuls computed in as each run measured it at its first step
(measurements.precision). Pure: dicts and Profiles in, lists of {key, before, after} out."""

from __future__ import annotations

from gpuprof.profile import Profile


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


# The precision facts older files copied into run.config: compared as measured (precision_changes),
# not as the config's copies, which a newer file no longer writes.
PRECISION_COPIES = ("autocast_dtype", "tf32_matmul")
PRECISION_KEYS = ("compute_dtype", "autocast_dtype", "param_dtype", "tf32_matmul")


def config_changes(cb: dict, ca: dict) -> list[dict]:
    """run.config keys whose value differs (nested sections as dotted keys). A key one side does not
    have is "not set"; one absent on one side and empty, zero or false on the other is no change."""
    fb = {k: v for k, v in _flatten(cb).items() if k not in PRECISION_COPIES and not k.startswith("precision.")}
    fa = {k: v for k, v in _flatten(ca).items() if k not in PRECISION_COPIES and not k.startswith("precision.")}
    return _changes(fb, fa)


def precision_changes(before: Profile, after: Profile) -> list[dict]:
    """What the matmuls computed in, as each run measured it at its first step
    (measurements.precision, or run.config.precision in older files), under `precision.<key>`;
    a file without the record has no precision to compare (nothing listed)."""
    pb, pa = before.sections.precision, after.sections.precision
    if not (pb.present and pa.present):
        return []
    return _changes({f"precision.{k}": getattr(pb, k) for k in PRECISION_KEYS if getattr(pb, k) is not None},
                    {f"precision.{k}": getattr(pa, k) for k in PRECISION_KEYS if getattr(pa, k) is not None})


def _changes(fb: dict, fa: dict) -> list[dict]:
    out = []
    for key in list(fb) + [k for k in fa if k not in fb]:
        has_b, has_a = key in fb, key in fa
        vb, va = fb.get(key), fa.get(key)
        if has_b and has_a:
            if vb != va:
                out.append({"key": key, "before": vb, "after": va})
        elif (vb if has_b else va) not in (None, 0, 0.0, False, "", [], {}):
            out.append({"key": key, "before": vb, "after": va, "missing": "after" if has_b else "before"})
    return out
