"""The hint-file protocol (seamguard/hintfiles.py) is one definition for both sides: what
the control plane's actuator writes, the job's launcher takes, value for value."""

import subprocess
import sys

import pytest

from seamguard import hintauth, hintfiles
from seamguard.act.runtime import RuntimeHintActuator
from seamguard.decide.actions import Action, Verb, action_key


class DictStore:
    def __init__(self):
        self.d: dict[str, bytes] = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def add(self, k, n):
        self.d[k] = str(int(self.d.get(k, b"0")) + n).encode()
        return int(self.d[k])

    def check(self, ks):
        return all(k in self.d for k in ks)

    def get(self, k):
        return self.d[k]


def test_every_value_a_writer_makes_is_one_the_reader_takes():
    for seconds in (None, 3.5, 600):
        assert hintfiles.interval_error(hintfiles.interval_text(seconds)) is None
    for on in (True, False):
        assert hintfiles.degraded_error(hintfiles.degraded_text(on)) is None
    for rails in ({}, {"rail0": 3}, {"rail1": hintfiles.SEVERITY_UNKNOWN, "rail0": 1}):
        text = hintfiles.avoid_rails_text(rails)
        assert hintfiles.avoid_rails_error(text) is None and hintfiles.parse_avoid_rails(text) == rails
    assert hintfiles.ranks_on(hintfiles.placement_text("j", 2, {1: "n1", 0: "n0", 3: "n1"}), "n1") == [1, 3]
    for name in (hintfiles.CHECKPOINT_NOW, hintfiles.evacuate_file(7), hintfiles.rollback_to_file(40),
                 *hintfiles.VALUE_ERRORS):
        assert hintfiles.is_hint_file(name)
    assert not hintfiles.is_hint_file(hintfiles.PLACEMENT_FILE)


@pytest.mark.parametrize("text, bad", [("0", "seconds > 0"), ("inf", "seconds > 0"), ("soon", "seconds > 0")])
def test_a_bad_interval_is_named(text, bad):
    assert bad in hintfiles.interval_error(text)


def test_what_the_actuator_writes_the_launcher_forwards(tmp_path):
    from seamguard.runtime import keys
    from seamguard.runtime.launcher import _hint_files

    hints = tmp_path / "hints"
    hints.mkdir()
    key = hintauth.create_key(hints / hintauth.KEY_FILE_NAME)
    act = RuntimeHintActuator({"train": hints})
    interval = Action(key=action_key(Verb.CHECKPOINT_INTERVAL, "train", value="120"), verb=Verb.CHECKPOINT_INTERVAL,
                      target="train", target_kind="job", params=(("interval_s", "120"),), reason="seamguard: x")
    assert act.apply(interval).ok   # writes checkpoint_interval_s and degraded
    (hints / hintfiles.PLACEMENT_FILE).write_text(hintfiles.placement_text("train", 0, {0: "n0"}))
    link = Action(key=action_key(Verb.AVOID_LINK, "n0/nic1~sw1"), verb=Verb.AVOID_LINK,
                  target="n0/nic1~sw1", target_kind="link", reason="seamguard: suspect flapping")
    assert act.apply(link).ok        # writes avoid_rails
    store, refused = DictStore(), []
    _hint_files(store, hints, hintauth.HintGate(key), refused.append)
    assert refused == []
    value = {k: hintauth.unseal(key, k, store.get(k).decode())[1]
             for k in (keys.HINT_INTERVAL_S, keys.HINT_DEGRADED, keys.HINT_AVOID_RAILS)}
    assert value[keys.HINT_INTERVAL_S] == "120" and value[keys.HINT_DEGRADED] == "on"
    assert list(hintfiles.parse_avoid_rails(value[keys.HINT_AVOID_RAILS])) == ["nic1"]
    assert store.get(keys.HINT_INTERVAL_N) == b"1" and store.get(keys.HINT_AVOID_RAILS_N) == b"1"


def test_the_protocol_and_the_actuator_import_no_torch():
    code = "import sys, seamguard.hintfiles, seamguard.act.runtime; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
