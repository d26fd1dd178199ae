"""ftcomm.settings: defaults, units, and a clear error naming the variable for a bad value."""
import pytest

from ftcomm import settings


def test_defaults(monkeypatch):
    for name in settings.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert settings.default_timeout() == 600.0
    assert settings.fence_timeout() == 10.0  # at most 10 s by default: silence means "stopped"
    assert settings.late_rank_fence() is True
    assert settings.chunk_bytes() == 1 << 20
    assert settings.recovery_policy() == "shrink" and settings.recovery_policy(default="spares") == "spares"


def test_fence_timeout_follows_a_short_collective_timeout(monkeypatch):
    monkeypatch.delenv("FTCOMM_FENCE_TIMEOUT", raising=False)
    monkeypatch.setenv("FTCOMM_TIMEOUT", "5")
    assert settings.fence_timeout() == 5.0
    monkeypatch.setenv("FTCOMM_FENCE_TIMEOUT", "2.5")
    assert settings.fence_timeout() == 2.5


@pytest.mark.parametrize("name,value,why", [
    ("FTCOMM_TIMEOUT", "soon", "could not convert"),
    ("FTCOMM_TIMEOUT", "-1", "positive number of seconds"),
    ("FTCOMM_LATE_RANK", "kill", "must be one of fence, raise"),
    ("FTCOMM_SPARES", "-2", "non-negative integer"),
])
def test_bad_value_names_the_variable(monkeypatch, name, value, why):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}='{value}'.*{why}"):
        settings.SETTINGS[name].get()


def test_raise_policy(monkeypatch):
    monkeypatch.setenv("FTCOMM_LATE_RANK", "raise")
    assert settings.late_rank_fence() is False


@pytest.mark.parametrize("plane, named", [("ring", "ftcomm's ring (FTCOMM_DATA_PLANE=ring)"),
                                          ("gloo", "an inner gloo group (FTCOMM_DATA_PLANE=gloo)")])
def test_cuda_status_names_the_data_plane_and_why(monkeypatch, plane, named):
    from ftcomm.core import cuda

    monkeypatch.setenv("FTCOMM_DATA_PLANE", plane)
    assert f"gradient buckets go through {named}" in cuda.cuda_status()
    assert "NCCL is not a data plane" in cuda.cuda_status()
    assert cuda.data_plane_status(cuda=True).startswith("data plane: CUDA tensors are staged through page-locked")
    assert "staged" not in cuda.data_plane_status(cuda=False)


@pytest.mark.parametrize("guard", ["FTCOMM_CHECKSUMS", "FTCOMM_FINGERPRINTS"])
def test_cuda_status_says_the_corruption_guard_keeps_the_buckets_on_the_ring(monkeypatch, guard):
    from ftcomm.core import cuda

    monkeypatch.setenv("FTCOMM_DATA_PLANE", "gloo")
    monkeypatch.setenv(guard, "1")
    status = cuda.data_plane_status(cuda=False)
    assert "gradient buckets go through ftcomm's ring, not the gloo plane: the corruption guard" in status
    assert "ZeRO's parameter allgather through an inner gloo group" in status
