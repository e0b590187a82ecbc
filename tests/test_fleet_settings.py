"""The ``fleet`` section (SPEC §12): unset is one host; a store is a postgresql:// URL, anything else one clear line."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from worker.settings import ConfigError, Settings


def test_unset_is_one_host(make_settings: Callable[..., Settings]) -> None:
    assert make_settings().fleet.store is None


def test_the_store_comes_from_the_environment_with_its_password(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(
        {"TASUKI__FLEET__STORE": "postgresql://tasuki:pw@db:5432/tasuki", "TASUKI__FLEET__LEASE_S": "30"}
    )
    assert settings.fleet.store == "postgresql://tasuki:pw@db:5432/tasuki"
    assert settings.fleet.lease_s == 30


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("STORE", "mysql://db/tasuki", "postgresql:// URL"),
        ("STORE", "/var/lib/tasuki", "postgresql:// URL"),
        ("LEASE_S", "0", "greater than 0"),
    ],
)
def test_a_bad_fleet_setting_is_one_line(
    make_settings: Callable[..., Settings], key: str, value: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        make_settings({f"TASUKI__FLEET__{key}": value})
    message = str(caught.value)
    assert words in message
    assert f"fleet.{key.lower()}" in message
    assert "\n" not in message
