"""A child that logs one record through ``corral.child.connect`` and exits."""

from __future__ import annotations

import logging

import corral.child

corral.child.connect(logging.INFO)
logging.getLogger("honest").info("still heard")
