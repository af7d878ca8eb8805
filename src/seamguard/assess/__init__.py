"""Assessment: scores (GFS, PRS, FAE), states, admissibility. Pure functions, no I/O."""

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS, AdmissibilityConfig, admissible_nodes
from seamguard.assess.assessment import (ASSESSED_KINDS, AssessConfig, Assessment, KindAssessment, Reason,
                                         Transition, assess, initial_states)
from seamguard.assess.states import STATE_BY_LABEL, Hysteresis, State, StateVector, step_states

__all__ = ["ADMISSIBILITY_COLUMNS", "ASSESSED_KINDS", "AdmissibilityConfig", "AssessConfig", "Assessment",
           "Hysteresis", "KindAssessment", "Reason", "STATE_BY_LABEL", "State", "StateVector", "Transition",
           "admissible_nodes", "assess", "initial_states", "step_states"]
