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


def settings_changes(before: Profile, after: Profile) -> list[dict]:
    """What compare lists as changed: run.config's keys, and what the matmuls computed in as both
    runs measured it (precision_changes). Where a side has no precision record (a file before it
    was a measurement), the config's own copies of the precision are compared instead, as then."""
    measured = before.sections.precision.present and after.sections.precision.present
    return (config_changes(before.config, after.config, precision_measured=measured)
            + (precision_changes(before, after) if measured else []))


def config_changes(cb: dict, ca: dict, *, precision_measured: bool = False) -> list[dict]:
    """run.config keys whose value differs (nested sections as dotted keys). A key one side does not
    have is "not set"; one absent on one side and empty, zero or false on the other is no change.
    `precision_measured`: both runs recorded their precision, so the config's copies of it
    (PRECISION_COPIES, `precision.*`) are left to precision_changes."""
    def keep(k):
        return not (precision_measured and (k in PRECISION_COPIES or k.startswith("precision.")))

    fb = {k: v for k, v in _flatten(cb).items() if keep(k)}
    fa = {k: v for k, v in _flatten(ca).items() if keep(k)}
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
