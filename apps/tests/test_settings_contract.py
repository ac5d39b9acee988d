"""The shared settings mechanism (dinops.settings): what every app's environment check accepts and refuses."""

from __future__ import annotations

import pytest

from dinops.settings import Setting, SettingsError, check_unknown_env, positive_int

TABLE = (Setting("workers", 1, "workers", type=positive_int, env="DINO_WORKERS"),)


def test_kubernetes_service_links_are_not_settings_but_misspellings_are_errors():
    links = {"DINO_API_SERVICE_HOST": "10.0.0.1", "DINO_API_PORT": "tcp://10.0.0.1:8000", "DINO_API_PORT_8000_TCP": "x"}
    check_unknown_env(TABLE, ("DINO_",), links | {"DINO_WORKERS": "2"})
    with pytest.raises(SettingsError, match="DINO_WORKRES"):
        check_unknown_env(TABLE, ("DINO_",), links | {"DINO_WORKRES": "2"})


@pytest.mark.parametrize("text", ["0", "-3"])
def test_positive_int_refuses(text):
    with pytest.raises(ValueError, match="at least 1"):
        positive_int(text)
