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


@pytest.mark.parametrize("text", ["gloo", "GLOO", " Gloo "])
def test_a_word_setting_takes_any_case(monkeypatch, text):
    monkeypatch.setenv("FTCOMM_DATA_PLANE", text)
    assert settings.data_plane() == "gloo"


def test_raise_policy(monkeypatch):
    monkeypatch.setenv("FTCOMM_LATE_RANK", "raise")
    assert settings.late_rank_fence() is False


@pytest.mark.parametrize("plane, named, on_cuda", [
    ("ring", "ftcomm's ring (FTCOMM_DATA_PLANE=ring)", "are staged through page-locked host memory to ftcomm's ring"),
    ("gloo", "an inner gloo group (FTCOMM_DATA_PLANE=gloo)", "go through the inner gloo group as they are"),
    ("nccl", "ftcomm's ring (FTCOMM_DATA_PLANE=nccl)", None)])
def test_cuda_status_names_the_data_plane_and_why(monkeypatch, plane, named, on_cuda):
    import torch.distributed as dist

    from ftcomm.core import cuda

    monkeypatch.setenv("FTCOMM_DATA_PLANE", plane)
    assert f"gradient buckets on host tensors go through {named}" in cuda.cuda_status()
    with_cuda = cuda.data_plane_status(cuda=True)
    if on_cuda is None:  # nccl: NCCL where torch has it and a device, else the ring, and why
        import torch

        usable = dist.is_nccl_available() and torch.cuda.is_available()
        on_cuda = ("go through an inner NCCL group, in device memory" if usable else
                   "are staged through page-locked host memory to ftcomm's ring: ")
        assert f"on CUDA tensors they {on_cuda}" in cuda.data_plane_status(cuda=False)
    else:
        assert "on CUDA tensors" not in cuda.data_plane_status(cuda=False)
    assert f"on CUDA tensors they {on_cuda}" in with_cuda
    assert "other collectives go through ftcomm's ring (CUDA tensors staged" in with_cuda


@pytest.mark.parametrize("guard,plane", [("FTCOMM_CHECKSUMS", "gloo"), ("FTCOMM_FINGERPRINTS", "ring")])
def test_cuda_status_says_the_corruption_guard_keeps_the_buckets_on_the_ring(monkeypatch, guard, plane):
    from ftcomm.core import cuda

    monkeypatch.setenv("FTCOMM_DATA_PLANE", plane)
    monkeypatch.setenv(guard, "1")
    assert settings.buckets_on_data_plane() is False
    status = cuda.data_plane_status(cuda=False)
    instead = ", not the FTCOMM_DATA_PLANE=gloo plane" if plane == "gloo" else ""
    assert f"gradient buckets go through ftcomm's ring, each committed on its own{instead}: the corruption guard" in status
    host_plane = "an inner gloo group" if plane == "gloo" else "ftcomm's ring"
    assert f"ZeRO's parameter allgather goes through {host_plane}" in status
    assert "on CUDA tensors" not in status


def test_cuda_status_says_fingerprints_ride_in_the_step_agreement_on_the_gloo_plane(monkeypatch):
    from ftcomm.core import cuda

    monkeypatch.setenv("FTCOMM_DATA_PLANE", "gloo")
    monkeypatch.setenv("FTCOMM_FINGERPRINTS", "1")
    monkeypatch.delenv("FTCOMM_CHECKSUMS", raising=False)
    assert settings.buckets_on_data_plane() is True
    assert ("gradient buckets on host tensors go through an inner gloo group (FTCOMM_DATA_PLANE=gloo), their result "
            "fingerprints compared in the step's agreement") in cuda.data_plane_status(cuda=False)
    # a group keeps the plane it was made with, whatever FTCOMM_DATA_PLANE says later
    monkeypatch.setenv("FTCOMM_DATA_PLANE", "ring")
    assert settings.buckets_on_data_plane("gloo") is True and settings.buckets_on_data_plane() is False


def test_cuda_status_says_per_bucket_commits_keep_the_buckets_on_the_ring(monkeypatch):
    from ftcomm.core import cuda

    monkeypatch.setenv("FTCOMM_DATA_PLANE", "gloo")
    monkeypatch.setenv("FTCOMM_STEP_COMMIT", "0")
    assert settings.buckets_on_data_plane() is False
    assert ("gradient buckets go through ftcomm's ring, each committed on its own, not the FTCOMM_DATA_PLANE=gloo "
            "plane: FTCOMM_STEP_COMMIT=0 commits each bucket on its own") in cuda.data_plane_status(cuda=True)
