"""The provider's own price list: OpenRouter's `GET /models` (and the local stand-in's, which speaks it), read for
`router-lite forecast` when the pool's key is set. Prices there are USD per token, as strings; here USD per million
tokens, as `config/prices.yaml` has them."""
from __future__ import annotations

import httpx

from pipeline.collect.costs import price_problem
from resources.pool import PoolResource


def provider_prices(pool: PoolResource, timeout_s: float = 20.0) -> tuple[dict[str, tuple[float, float]], str]:
    """({model id: (USD in, USD out per million tokens)}, a note). Empty, with the reason, when the pool's kind has
    no models endpoint, no key is set, or the endpoint cannot be read (the forecast then uses list prices)."""
    spec = pool.spec()
    if not spec.key_required:
        return {}, f"pool kind {pool.kind!r}: list prices"
    key = pool._key()
    if not key:
        return {}, f"no {pool.key_env()}: list prices"
    base = pool._base_url(None)
    if not pool.key_allowed(base):
        return {}, f"base URL {base} may not receive the key: list prices"
    try:
        r = httpx.get(base.rstrip("/") + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
        r.raise_for_status()
        data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return {}, f"models endpoint unreadable ({type(exc).__name__}): list prices"
    out = {}
    for m in data:
        try:
            p = m["pricing"]
            price = (float(p["prompt"]) * 1e6, float(p["completion"]) * 1e6)
        except (KeyError, TypeError, ValueError):
            continue
        if not any(price_problem(v) for v in price):  # a negative, NaN or infinite price: the list price stands
            out[str(m["id"])] = price
    return out, f"{len(out)} prices from {base}/models"
