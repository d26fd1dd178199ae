"""One process, no mpirun (an MPI singleton, ULFM off): everything works failure-free and the
recovery verbs say how to get ULFM."""
import numpy as np
import pytest

import ftcomm


@pytest.fixture(scope="module")
def comm():
    return ftcomm.Communicator()


def test_singleton_is_size_one_without_ft(comm):
    assert (comm.rank, comm.size) == (0, 1)
    assert comm.ft_enabled is False and ftcomm.ft_enabled() is False
    assert ftcomm.ft_compiled_in() is True  # both Open MPI and MPICH declare ULFM's functions


def test_ulfm_status_says_which_mpi_and_why_no_recovery():
    status = ftcomm.ulfm_status()
    if ftcomm.mpi_family() == "Open MPI":  # a singleton: not launched with --with-ft ulfm
        assert status.startswith("Open MPI v5.0.") and "runs without ULFM: launch with `ftcomm-run" in status
    else:
        assert ftcomm.mpi_family() == "MPICH"
        assert status.startswith("MPICH 5.0.") and "(device ch4:" in status and "has no fault tolerance" in status
        assert "recovery needs an MPI with ULFM: Open MPI 5" in status


@pytest.mark.parametrize("verb", ["revoke", "shrink", "failed_ranks", "recover"])
def test_recovery_verbs_raise_ulfm_unavailable(comm, verb):
    with pytest.raises(ftcomm.UlfmUnavailableError) as exc:
        getattr(comm, verb)()
    assert str(exc.value).startswith(f"{verb} needs ULFM, which this job lacks: {ftcomm.ulfm_status()}")


def test_allreduce_of_one_rank_is_identity_and_avg_divides_by_one(comm):
    buf = np.array([1.5, -2.0, 3.0], np.float32)
    comm.allreduce(buf, op="avg")
    np.testing.assert_array_equal(buf, [1.5, -2.0, 3.0])
    phases = comm.last_phases  # where the call's time went, in seconds
    assert set(phases) == {"validate_s", "ring_s", "agree_s"} and all(0 <= v < 5 for v in phases.values())


def test_torch_tensor_and_bfloat16(comm):
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    comm.allreduce(t, op="max")
    assert t.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad, message", [
    (np.ones((4, 4), np.float32)[:, 1], "not contiguous"),
    (np.ones(3, np.complex64), "unsupported dtype"),
    (np.ones(3, ">f4"), "unsupported dtype"),  # byte-swapped: its sums would be garbage
    ([1.0, 2.0], "not an array or tensor"),
])
def test_bad_buffers_are_rejected_with_the_reason(comm, bad, message):
    with pytest.raises(ftcomm.InvalidInputError, match=message):
        comm.allreduce(bad)


def test_unknown_op_is_rejected(comm):
    with pytest.raises(ftcomm.InvalidInputError, match="op is not supported"):
        comm.allreduce(np.ones(2), op="median")


def test_steps_must_increase(comm):
    step = comm.allreduce(np.ones(2))
    with pytest.raises(ftcomm.InvalidInputError, match="steps must increase"):
        comm.allreduce(np.ones(2), step=step - 1)
    assert comm.allreduce(np.ones(2), step=step) == step  # replay is fine


def test_agree_and_barrier_without_ulfm(comm):
    assert comm.agree(0b1011) == 0b1011
    comm.barrier()
    with pytest.raises(ValueError):
        comm.agree(-1)


def test_the_communicators_timeout_is_the_default_deadline_and_is_inherited(monkeypatch):
    monkeypatch.setenv("FTCOMM_TIMEOUT", "77")
    own = ftcomm.Communicator(timeout=3)
    assert own.timeout == 3.0 and own._deadline(None) == 3.0 and own._deadline(0.5) == 0.5
    assert own.split(0, 0).timeout == 3.0
    plain = ftcomm.Communicator()
    assert plain.timeout is None and plain._deadline(None) == 77.0  # FTCOMM_TIMEOUT, read at the call
    for bad in (0, -1.0, "soon"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            ftcomm.Communicator(timeout=bad)


def test_errors_carry_step_and_failed_ranks():
    from ftcomm.core.codes import StatusCode, exception_from_status

    exc = exception_from_status(StatusCode.PROC_FAILED, "boom", [2, 3], 7)
    assert isinstance(exc, ftcomm.ProcFailedError) and isinstance(exc, ftcomm.FtError)
    assert (exc.step, exc.failed_ranks) == (7, [2, 3])
    assert isinstance(exception_from_status(StatusCode.TIMEOUT, "slow", [], -1), TimeoutError)
    assert isinstance(exception_from_status(StatusCode.INVALID_INPUT, "bad", [], 1), ValueError)


def test_every_status_code_has_its_exception():
    """The C++ status enum is the one source: each error code maps to its own exception class."""
    from ftcomm.core.codes import StatusCode, exception_from_status

    classes = {c: type(exception_from_status(c, "", [], -1)) for n, c in StatusCode.__members__.items() if n != "OK"}
    assert len(set(classes.values())) == len(classes) and ftcomm.FtError not in classes.values()


def test_an_aborting_rank_waits_until_the_launcher_has_read_its_last_words(tmp_path):
    """Before MPI_Abort a rank waits until its stderr pipe is empty (the launcher has read the
    reason), at most the limit; with nobody reading it gives up at the limit; a file is no pipe,
    and a closed or missing stream no stream: no wait."""
    import os
    import threading
    import time

    from ftcomm.core.runtime import _wait_for_launcher_to_read

    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as stream:
        stream.write("ftcomm: world rank 1 ended by an uncaught exception\n")
        stream.flush()
        got = []
        reader = threading.Timer(0.2, lambda: got.append(os.read(read_fd, 4096)))
        t0 = time.monotonic()
        reader.start()
        _wait_for_launcher_to_read(stream, limit_s=30.0)
        assert time.monotonic() - t0 >= 0.2  # it waited for the reader
        reader.join()
        assert got == [b"ftcomm: world rank 1 ended by an uncaught exception\n"]
        stream.write("unread\n")
        stream.flush()
        t0 = time.monotonic()
        _wait_for_launcher_to_read(stream, limit_s=0.3)
        assert time.monotonic() - t0 >= 0.3
        assert os.read(read_fd, 4096) == b"unread\n"  # still there: nobody had read it
    os.close(read_fd)
    with open(tmp_path / "log", "w") as stream:
        stream.write("x")
        t0 = time.monotonic()
        _wait_for_launcher_to_read(stream, limit_s=30.0)
        assert time.monotonic() - t0 < 10
    for gone in (None, stream):  # sys.stderr set to None, or closed: no wait, no error
        t0 = time.monotonic()
        _wait_for_launcher_to_read(gone, limit_s=30.0)
        assert time.monotonic() - t0 < 10
