"""The pure parts of act/slurm_jobs.py: seamguard's AdminComment token and `scontrol show -o` lines."""

import pytest

from seamguard.act.slurm_jobs import Token, parse_show_job, parse_token


def test_token_round_trip():
    tok = Token("move_job:pretrain@cdu-a", "moved", 1764180000.7, ("n1", "n2"))
    text = tok.render("seamguard")
    assert text == "seamguard:move_job:pretrain@cdu-a;moved=1764180000;exc=n1,n2"
    assert parse_token(text, "seamguard") == Token("move_job:pretrain@cdu-a", "moved", 1764180000.0, ("n1", "n2"))
    asked = parse_token("seamguard:move_job:pretrain@cdu-a;asked=5;exc=", "seamguard")
    assert asked is not None and asked.phase == "asked" and asked.excluded == ()


@pytest.mark.parametrize("word", [
    "",
    "(null)",
    "ticket-42",
    "other:move_job:pretrain@cdu-a;moved=5;exc=n1",     # another owner's tag
    "seamguard:move_job:pretrain@cdu-a;exc=n1",          # no phase
    "seamguard:move_job:pretrain@cdu-a;moved=soon",      # not a time
    "seamguard:drain:n1;moved=5",                        # not a move
    "seamguard:nonsense;moved=5",                        # not a key
])
def test_anything_else_is_not_our_token(word):
    assert parse_token(word, "seamguard") is None


def test_show_job_line_keeps_first_words_of_free_text():
    line = ("JobId=7 JobName=train UserId=root(0) JobState=RUNNING Reason=None "
            "AdminComment=seamguard:move_job:train@cdu-a;moved=9;exc=n1 ticket 42 Comment=(null) "
            "NodeList=n[2-3] ExcNodeList=n1 ReqNodeList=(null) Command=/tmp/a b.sh")
    f = parse_show_job(line)
    assert f["JobId"] == "7" and f["JobState"] == "RUNNING" and f["NodeList"] == "n[2-3]"
    assert f["AdminComment"] == "seamguard:move_job:train@cdu-a;moved=9;exc=n1"
    assert f["ReqNodeList"] == "(null)" and f["Command"] == "/tmp/a"
