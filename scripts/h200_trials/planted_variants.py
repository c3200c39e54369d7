"""Variants with a known truth, for checking verdicts on a real GPU (scripts/h200_trials/run.sh).

- ``sdpa_twin``: the default variant ``sdpa`` under another name: whatever the harness says of it against ``sdpa``
  in one run is a null comparison.
- ``sdpa_plus5``: ``sdpa``, plus the attention of the last S/40 query rows against every key again: about 5% more
  work than causal attention over S rows (S^2/2 query-key pairs + S/40 * S = 1.05x), returned with the output so
  that MLX cannot skip it. A planted slowdown of about 5%.
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


for _variant in (Variant("sdpa_twin", sdpa_twin), Variant("sdpa_plus5", sdpa_plus5)):
    _kernel.variants.setdefault(_variant.name, _variant)
