"""Optimizers: parameter groups by role with per-group weight decay (decoupled or L2)."""

from .es import PGPE as PGPE
from .es import OpenAIES as OpenAIES
from .es import centered_ranks as centered_ranks
from .es import vectorize as vectorize
from .es import worst_case as worst_case
from .groups import ROLES as ROLES
from .groups import build_optimizer as build_optimizer
from .groups import l2_penalty as l2_penalty
from .groups import parameter_groups as parameter_groups
from .groups import parameter_roles as parameter_roles
from .lq import lq_loss as lq_loss
