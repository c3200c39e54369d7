"""Variants with a known truth, for checking verdicts on a real GPU (bench/h200_trials/run.sh).

- ``sdpa_twin``: the default variant ``sdpa`` under another name: whatever the harness says of it against ``sdpa``
  in one run is a null comparison.
- ``sdpa_plus5``: ``sdpa``, plus the attention of the last S/40 query rows against every key again: about 5% more
  work than causal attention over S rows (S^2/2 query-key pairs + S/40 * S = 1.05x), returned with the output so
  that MLX cannot skip it. A planted slowdown of about 5% of the work, but one more kernel launch: on kernels of
  20-50 us the launch costs 15-120 %, so it is not a 5 % slowdown there.
- ``sdpa_keys5``: ``sdpa`` with S/40 more keys in front, in one call: with the causal mask aligned to the tail every
  query sees S/40 more keys, S * S/40 = S^2/40 more query-key pairs on top of S^2/2, i.e. 5 % more work. The longer
  K and V are built once per input (on the warm-up call, outside the timed ones), so a timed call is one SDPA launch
  doing about 5 % more work: a planted slowdown at any size, as far as the kernel's time follows its work.
"""

from __future__ import annotations

from kernels import REGISTRY, Variant

_kernel = REGISTRY["flash_prefill"]
_sdpa = _kernel.variants["sdpa"].fn


def sdpa_twin(q, k, v, scale):
    return _sdpa(q, k, v, scale)


def sdpa_plus5(q, k, v, scale):
    import mlx.core as mx  # loads mlx: only in a job process

    rows = max(1, q.shape[2] // 40)
    extra = mx.fast.scaled_dot_product_attention(q[:, :, -rows:], k, v, scale=scale)
    return [_sdpa(q, k, v, scale), extra]


_longer: dict[int, tuple] = {}  # id(k) -> (k, k and v with S/40 more keys): built on the first (warm-up) call


def sdpa_keys5(q, k, v, scale):
    import mlx.core as mx  # loads mlx: only in a job process

    if id(k) not in _longer or _longer[id(k)][0] is not k:
        extra = max(1, k.shape[2] // 40)
        padded = (mx.concatenate([k[:, :, :extra], k], axis=2), mx.concatenate([v[:, :, :extra], v], axis=2))
        mx.eval(padded)
        _longer[id(k)] = (k, padded)
    k_long, v_long = _longer[id(k)][1]
    return _sdpa(q, k_long, v_long, scale)


for _variant in (Variant("sdpa_twin", sdpa_twin), Variant("sdpa_plus5", sdpa_plus5),
                 Variant("sdpa_keys5", sdpa_keys5)):
    _kernel.variants.setdefault(_variant.name, _variant)
