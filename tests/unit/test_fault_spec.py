import pytest

from ftcomm import fault


def test_parse_full_spec():
    specs = fault.parse("rank=2,point=allgather,step=3,ring_step=1,chunk=0,kind=exit; point=commit")
    assert specs == [
        {"rank": 2, "point": "allgather", "step": 3, "ring_step": 1, "chunk": 0, "kind": "exit"},
        {"rank": -1, "point": "commit", "step": -1, "ring_step": -1, "chunk": -1, "kind": "kill"},
    ]


def test_parse_empty_is_no_fault():
    assert fault.parse("") == []


@pytest.mark.parametrize("bad", ["rank=2", "point=x,kind=explode", "point=x,color=red", "point=x,step=three"])
def test_parse_rejects_malformed_specs(bad):
    with pytest.raises(ValueError):
        fault.parse(bad)
