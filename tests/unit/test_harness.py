"""The test harness's report lines: a long report goes out in parts that come back whole, in
order with the short ones, even when another rank's lines fall between its parts."""
import json

from harness import _PART_CHARS, parse_reports, report


def test_long_reports_are_split_and_put_together(capfd):
    big = {"digests": {f"case{i}": "%016x" % (i * 7919) for i in range(400)}}
    report(world_rank=3, event="small", value=1)
    report(world_rank=3, **big)
    out = capfd.readouterr().out
    lines = out.splitlines()
    assert len(lines) > 3 and all(len(line) < _PART_CHARS + 100 for line in lines)
    other = "FTCOMM-REPORT " + json.dumps({"world_rank": 0, "event": "other"})
    mixed = "\n".join([lines[0], lines[1], other, *lines[2:]])  # rank 0's line between rank 3's parts
    assert parse_reports(mixed) == [{"world_rank": 3, "event": "small", "value": 1}, {"world_rank": 0, "event": "other"},
                                    {"world_rank": 3, **big}]
