"""pipeline.core.environ: variables set (or unset) for a block, each as before afterwards, an exception included."""
import os

import pytest

from pipeline.core.environ import environ


def test_environ_sets_unsets_and_restores(monkeypatch):
    monkeypatch.setenv("ROUTER_LITE_T_SET", "before")
    monkeypatch.delenv("ROUTER_LITE_T_NEW", raising=False)
    with environ(ROUTER_LITE_T_SET=None, ROUTER_LITE_T_NEW="inside"):
        assert "ROUTER_LITE_T_SET" not in os.environ and os.environ["ROUTER_LITE_T_NEW"] == "inside"
    assert os.environ["ROUTER_LITE_T_SET"] == "before" and "ROUTER_LITE_T_NEW" not in os.environ
    with pytest.raises(KeyError), environ(ROUTER_LITE_T_SET="changed"):
        raise KeyError("a failing command")
    assert os.environ["ROUTER_LITE_T_SET"] == "before"
