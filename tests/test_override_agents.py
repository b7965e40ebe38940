"""An override file adds agent pools (`agents: {pools: ...}`, the shape of config/agents.yaml) and the profile's
`serve.target` is checked like every other setting."""
import pytest

from pipeline.core.config import OVERRIDE_ENV
from pipeline.core.errors import RouterLiteError
from pipeline.profile import load_profile
from resources.pool import PoolResource

MINE = """
agents:
  pools:
    my_pool:
      extends: pilot
      provider: openrouter
      base_url: https://openrouter.ai/api/v1
      agents:
        - {name: my_llama, model: meta-llama/llama-3.3-70b-instruct, price_in_per_mtok: 0.12, price_out_per_mtok: 0.3}
pool: {name: my_pool}
"""


def test_an_override_adds_a_pool_and_selects_it(tmp_path, monkeypatch):
    f = tmp_path / "mine.yaml"
    f.write_text(MINE)
    monkeypatch.setenv(OVERRIDE_ENV, str(f))
    prof = load_profile("pilot")
    agents = PoolResource(kind=prof.pool.kind, pool=prof.pool.name).agents()
    assert prof.pool.name == "my_pool" and [a.name for a in agents][-2:] == ["open_cheap_reasoning", "my_llama"]
    assert agents[-1].price_in_per_mtok == 0.12
    monkeypatch.delenv(OVERRIDE_ENV)
    with pytest.raises(RouterLiteError, match="unknown pool 'my_pool'"):  # without the override: not a pool
        PoolResource(kind="openrouter", pool="my_pool").agents()


def test_a_malformed_agents_section_is_one_error_naming_the_file(tmp_path, monkeypatch):
    f = tmp_path / "bad.yaml"
    f.write_text("agents: {my_pool: {agents: []}}\n")
    monkeypatch.setenv(OVERRIDE_ENV, str(f))
    with pytest.raises(RouterLiteError, match=r"bad.yaml: `agents:` must be a mapping with one key, `pools:`"):
        PoolResource(kind="replay", pool="demo").agents()


def test_serve_target_is_a_checked_profile_setting(tmp_path, monkeypatch):
    assert load_profile("demo").serve.target == "quality>=0.98"
    f = tmp_path / "t.yaml"
    f.write_text("serve: {target: 'quality>=2'}\n")
    monkeypatch.setenv(OVERRIDE_ENV, str(f))
    with pytest.raises(RouterLiteError, match="serve.target"):
        load_profile("demo")
