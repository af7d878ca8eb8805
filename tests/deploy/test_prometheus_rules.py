"""deploy/prometheus: the rules load, their unit tests pass, and every metric they name is exported.

`promtool check rules` and `promtool test rules` (Debian's prometheus package) run the
file and its unit tests (seamguard-rules.test.yml: series as a healthy or failing
controller, gateway or agent exposes them, and the alerts that must or must not fire).
The metrics a rule's expression names are read from the expression (label matchers,
strings, grouping labels and functions taken out) and must each be one seamguard's code
exports — a metric family name in src/seamguard, with the suffix its exposition adds — a
recording rule of the same file, or Prometheus's own ``up``.
"""

import ast
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "seamguard-rules.yml"
SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count")
PROMETHEUS_OWN = {"up"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan"}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")


# ---- what the code exports -------------------------------------------------------------------------

def _strings(tree: ast.AST) -> set[str]:
    """String constants, and ``prefix + "name"`` where ``prefix`` is a string assigned in the same scope."""
    out = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for scope in ast.walk(tree):
        if not isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        names = {t.id: n.value.value for n in ast.walk(scope) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(scope):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and isinstance(n.left, ast.Name) \
                    and n.left.id in names and isinstance(n.right, ast.Constant) and isinstance(n.right.value, str):
                out.add(names[n.left.id] + n.right.value)
    return out


@functools.cache
def exported_metrics() -> frozenset[str]:
    """Every seamguard_* metric family named in the code, with the suffixes its exposition may add."""
    families = set()
    for p in (ROOT / "src" / "seamguard").rglob("*.py"):
        families |= {s for s in _strings(ast.parse(p.read_text())) if re.fullmatch(r"seamguard_[a-z0-9_]*[a-z0-9]", s)}
    return frozenset(f + sfx for f in families for sfx in SUFFIXES)


# ---- what the rules name ---------------------------------------------------------------------------

def metrics_named(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels, keywords or durations)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)      # strings
    e = re.sub(r"\{[^}]*\}", "", e)                                         # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # grouping labels
    e = re.sub(r"\[[^\]]*\]", "", e)                                        # ranges
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_metrics_named_reads_selectors_not_functions_or_labels():
    expr = ('sum by (verb, op) (increase(seamguard_actions_total{job="x", status=~"failed|refused"}[30m])) > 0 '
            'and on() (count(up{job="y"} == 1) > 0) or seamguard:ticks:rate5m == 0')
    assert metrics_named(expr) == {"seamguard_actions_total", "up", "seamguard:ticks:rate5m"}


def test_every_metric_a_rule_names_is_exported():
    exported = exported_metrics()
    assert {"seamguard_ticks_total", "seamguard_breaker_tripped", "seamguard_gateway_store_errors_total",
            "seamguard_agent_kernel_log_up"} <= exported
    recorded = {r["record"] for r in rules() if "record" in r}
    unknown = {(r.get("alert") or r.get("record"), n) for r in rules() for n in metrics_named(r["expr"])
               if n not in exported | recorded | PROMETHEUS_OWN}
    assert not unknown, f"rules name metrics seamguard does not export: {sorted(unknown)}"


def test_a_rule_naming_an_unexported_metric_is_caught():
    assert "seamguard_breaker_trippd" not in exported_metrics()
    assert "seamguard_breaker_trippd" in metrics_named("max(seamguard_breaker_trippd) == 1")


def test_rules_cover_the_health_an_operator_watches():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert {"SeamguardNoLeaderOrLoopDead", "SeamguardControllerLate", "SeamguardScopeFrozen",
            "SeamguardBreakerTripped", "SeamguardTickErrors", "SeamguardGatewayKeyStateDowngrade",
            "SeamguardAgentDown"} <= alerts
    assert any(r.get("record") == "seamguard:actions:increase1h" for r in rules())


@needs_promtool
def test_promtool_checks_the_rules():
    p = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@needs_promtool
def test_promtool_rule_unit_tests_pass():
    p = subprocess.run(["promtool", "test", "rules", "seamguard-rules.test.yml"], cwd=RULES_DIR,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
