"""Optimizers: parameter groups by role with per-group weight decay (decoupled or L2)."""

from .groups import ROLES as ROLES
from .groups import build_optimizer as build_optimizer
from .groups import l2_penalty as l2_penalty
from .groups import parameter_groups as parameter_groups
from .groups import parameter_roles as parameter_roles
