"""Shared fixtures."""

from __future__ import annotations

import pytest

from tests.support import DataFiles, make_data

# The Cloud Storage emulator and proxy fixtures (`gcs`, `bucket`); started only when used.
pytest_plugins = ["tests.gcs"]


@pytest.fixture(
    params=[
        "binary",
        pytest.param("multiclass", marks=pytest.mark.slow),
        pytest.param("regression", marks=pytest.mark.slow),
    ]
)
def any_head(request, tmp_path) -> tuple[str, DataFiles]:
    return request.param, make_data(tmp_path, request.param)


@pytest.fixture
def binary_data(tmp_path) -> DataFiles:
    return make_data(tmp_path, "binary")


@pytest.fixture(scope="session")
def private_network() -> None:
    """Skips a test that needs the local cluster's private network namespace where none can be
    made, saying why: Docker's default seccomp profile refuses unshare, Ubuntu 24.04 restricts
    unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1), a minimal
    image lacks util-linux."""
    from deploy.local.network import PrivateNetworkUnavailable, probe_private_network

    try:
        probe_private_network()
    except PrivateNetworkUnavailable as e:
        pytest.skip(f"no private network namespace can be made here: {e}")


def pytest_configure(config):
    # Two logical CPU devices, so that distribution strategies run several replicas in one
    # process (the runtime must not have started yet).
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    config.addinivalue_line(
        "markers",
        "slow: long end-to-end runs; `make test` skips them locally, CI (CI=true) runs them",
    )
    # google-api-core warns on every import that Python 3.11 support ends in 2027: noise here.
    config.addinivalue_line("filterwarnings", "ignore:You are using a Python version:FutureWarning")
